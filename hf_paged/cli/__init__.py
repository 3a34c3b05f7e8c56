"""The `hf-paged` command: `demo`, `generate`, `bench`, `serve`, `eval` (`commands.py`; `bench.py`, `eval.py`,
`demo.py`; the demo's and the benchmark's data in `datasets.py` and `workloads.py`)."""

from __future__ import annotations

from hf_paged.cli.commands import main

__all__ = ["main"]
