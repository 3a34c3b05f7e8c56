"""`benchmarks/grammar.py` times masks along sentences its processor accepts.

Since `GrammarLogitsProcessor` bounds `%ignore` matches by default (`max_ignored=1`, 287e535), the benchmark's walk over
Lark-derived sentences (whitespace runs of any length) was refused at the first run of two ignored characters; the
row ended and the walk went on timing the ended state's masks ("mask per token" of a dead row). The walk now uses
`max_ignored=None`, the sentences' language, and raises where a walked token is refused.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_jit(monkeypatch: pytest.MonkeyPatch) -> None:
    # `benchmarks/grammar.py` sets HF_PAGED_JIT=now for the whole process when imported: here for this test only
    monkeypatch.setenv("HF_PAGED_JIT", os.environ.get("HF_PAGED_JIT", "off"))


def test_the_mask_walk_stays_on_live_rows_for_every_grammar() -> None:
    from benchmarks import grammar as bench
    from hf_paged import default_model
    from tests.processors.lark_grammars import GRAMMARS

    _, tok = default_model()
    for name, grammar in GRAMMARS.items():
        first, memo, num_tokens = bench.mask_times(bench.walk_processor(grammar, tok), tok, grammar, 3)
        assert num_tokens > 0 and len(first) == len(memo) == num_tokens + 3, name


def test_the_walk_refuses_to_time_an_ended_row() -> None:
    from benchmarks import grammar as bench
    from hf_paged import default_model
    from hf_paged.processors import GrammarLogitsProcessor
    from tests.processors.lark_grammars import GRAMMARS

    _, tok = default_model()
    grammar = GRAMMARS["json"]  # its derived sentences open with whitespace runs (seed 11)
    bounded = GrammarLogitsProcessor(grammar, tok)  # the default: one ignored match between tokens
    with pytest.raises(RuntimeError, match="would time an ended row"):
        bench.mask_times(bounded, tok, grammar, 3)
