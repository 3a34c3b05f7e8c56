"""A custom store whose `contains` raises (a network store that is down) is a miss: counted as a failed load and
recomputed, as a `get` that raises is. h8 (F6): the OSError came out of `Engine.step()` (admission asks `contains`),
and the whole generate_batch failed."""

from __future__ import annotations

from hf_paged import Engine, PagedConfig
from hf_paged.kv_transfer import InProcessStore
from tests.tiny_models import ragged_prompts, run_engine, stock_greedy, tiny_model


class Down(InProcessStore):
    down = False

    def contains(self, key: bytes) -> bool:
        if self.down:
            raise OSError("the network store is down")
        return super().contains(key)


def test_a_contains_that_raises_is_a_counted_miss_not_a_failed_step():
    model, prompts = tiny_model("llama"), ragged_prompts([30, 25], seed=5)
    expected = stock_greedy(model, prompts, 6)
    store = Down()
    assert run_engine(Engine(model, PagedConfig(block_size=8), kv_store=store), prompts, 6) == expected
    store.down = True  # it holds their blocks now, and cannot say so
    engine = Engine(model, PagedConfig(block_size=8), kv_store=store)
    assert run_engine(engine, prompts, 6, pool_empty=True) == expected
    stats = engine.stats()
    assert stats["kv_transfer_loaded_blocks"] == 0 and stats["kv_transfer_load_failures"] == len(prompts)
    engine.check_integrity()
