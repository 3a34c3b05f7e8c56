"""The public face: `wrap` / `unwrap` (`wrapping.py`, `wrap_state.py`), the patched `generate` and
`generate_batch` (`generate*.py`), scoring (`scoring.py`) and the embedded model (`models.py`). Users reach these
names through `hf_paged` itself (`hf_paged.wrap`, ...); this face imports nothing."""
