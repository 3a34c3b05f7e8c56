"""A fork starts without a pin of its own (`Track.copy`): the parent's pin stays the parent's. A fork that
inherited the parent's `pinned` list dropped the parent's pin at its first call (`LocalBackend.pin` unpins the
track's old pin after pinning the new one), so the parent's prefix became evictable while the parent still runs;
most visibly when the fork's own pin is refused by `prefix_pin_share`: then nothing covers the parent's blocks."""

from __future__ import annotations

import hf_paged
from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from tests.programs.conftest import tiny_byte_llama

BLOCK = 8


def test_the_parents_pin_survives_a_fork_whose_own_pin_is_refused():
    model, tok = tiny_byte_llama()
    # 32 blocks, pins may hold 8: the parent's 6 pinned blocks fit, the fork's 10 would not
    hf_paged.wrap(model, block_size=BLOCK, num_blocks=32, prefix_pin_share=0.25)
    engine = engine_of(model)
    context = "Ticket: my invoice was charged twice this month"  # 48 bytes (the byte tokenizer: one token each)
    seen: dict[str, int] = {}

    def pinned() -> int:
        return engine.stats()["prefix_pinned_blocks"]

    @hp.program
    def flow(s):
        s += context + hp.gen("head", max_tokens=2)  # 49 tokens computed: the parent pins 6 full blocks
        s.sync()  # (appending is asynchronous)
        seen["after_head"] = pinned()
        (f,) = s.fork(1)
        f += " and the fork adds thirty bytes" + hp.gen("tail", max_tokens=2)  # ~80 tokens: a 10-block pin, refused
        f.sync()
        seen["after_fork"] = pinned()
        engine.check_integrity()
        s += " then" + hp.gen("more", max_tokens=2)  # the parent's next call reads its pinned prefix
        s.sync()
        seen["last_cached"] = s.calls[-1].tokens.cached

    flow.run(model, tok)
    assert seen["after_head"] == 48 // BLOCK
    assert seen["after_fork"] == 48 // BLOCK  # still the parent's (was 0: the fork unpinned it)
    assert seen["last_cached"] >= 48
    engine.check_integrity()
    assert not engine.live_requests()
    assert engine.cache.pool.num_used_blocks == 0  # every pin released exactly once at the end of the run
    assert pinned() == 0


def test_a_fork_pins_its_own_prefix_beside_the_parents(model_tok):
    """Both pins held while both states live (the parent's blocks carry two pins), each released once at the end."""
    model, tok = model_tok
    engine = engine_of(model)
    seen: dict[str, dict[int, int]] = {}

    @hp.program
    def flow(s):
        s += "Ticket: my invoice was charged twice this month" + hp.gen("head", max_tokens=2)  # 49 computed
        s.sync()
        parent_blocks = engine.kv.prefix_cache.pinned_ref_counts()
        (f,) = s.fork(1)
        f += " and the fork adds thirty bytes" + hp.gen("tail", max_tokens=2)
        f.sync()
        seen["parent"] = parent_blocks
        seen["both"] = engine.kv.prefix_cache.pinned_ref_counts()

    flow.run(model, tok)
    assert sorted(seen["parent"].values()) == [1] * 6
    both = seen["both"]
    assert {block: both[block] for block in seen["parent"]} == {block: 2 for block in seen["parent"]}
    assert sorted(count for block, count in both.items() if block not in seen["parent"]) == [1] * 4
