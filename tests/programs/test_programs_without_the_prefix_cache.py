"""A program on a model wrapped with `enable_prefix_caching=False` runs: nothing is pinned between calls (each call
prefills its whole prompt), and the fields are those of the same program with the prefix cache. It raised
`InvalidConfigError: pin_prefix needs the prefix cache` after its first call, that call's result lost."""

from __future__ import annotations

import hf_paged
from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from tests.programs.conftest import tiny_byte_llama


@hp.program
def flow(s):
    s += "Ticket: my invoice was charged twice this month. Intent: " + hp.gen("head", max_tokens=4)
    for f in s.fork(2):
        f += " Option: " + hp.gen("option", max_tokens=3)
    s += " Verdict: " + hp.select("verdict", ["yes", "no"])
    s += " Note: " + hp.gen("note", max_tokens=3, heal=True)


def _run(enable_prefix_caching: bool):
    model, tok = tiny_byte_llama()
    hf_paged.wrap(model, block_size=8, num_blocks=128, enable_prefix_caching=enable_prefix_caching)
    state = flow.run(model, tok)
    filled = hp.fill(model, tok, "Record: ", "id: [a], code: [b].", a=hp.regex("[0-9]{3}"), b=["xy", "zw"])
    engine = engine_of(model)
    engine.check_integrity()
    assert not engine.live_requests() and engine.cache.pool.num_used_blocks == 0
    return state, filled


def test_a_program_runs_without_the_prefix_cache_and_equals_it_with_one():
    state, filled = _run(False)
    cached_state, cached_filled = _run(True)
    assert state.text == cached_state.text and state.token_ids == cached_state.token_ids
    assert state["option"] == cached_state["option"] and state["verdict"] == cached_state["verdict"]
    assert filled.text == cached_filled.text
    assert state.tokens().cached == 0 and filled.tokens.cached == 0  # nothing reused, nothing pinned
    assert cached_state.tokens().cached > 0
