"""`max_cache_bytes` bounds everything a compressed cache allocates (README: "bounds all of it"): the quantized
blocks, the full-precision staging rows of partially written blocks, and the streaming heads' store, also when the
staging rows grow with use and the number of sequences is small (the rows the budget paid for are few)."""

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model


@pytest.mark.parametrize("max_num_seqs, setting", [
    (1, {"kv_cache_dtype": "int8"}),  # 3 staging rows paid for: doubling 2 -> 4 went past them
    (3, {"kv_cache_dtype": "int4"}),  # 5 paid for: doubling 4 -> 8
    (8, {"kv_streaming_heads": ((1,), (1,)), "num_sink_tokens": 8, "window_tokens": 16,
         "enable_prefix_caching": False}),  # the streaming store's slots are paid for too
])
def test_allocated_bytes_stay_within_the_budget(max_num_seqs, setting):
    model = tiny_model("llama")
    budget = 60_000
    engine = Engine(model, PagedConfig(block_size=8, max_cache_bytes=budget, max_num_seqs=max_num_seqs, **setting))
    # finished requests keep their partial block's staging row until rows run out: the high water climbs
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=8))
           for p in ragged_prompts([40, 29, 13, 21, 11, 5, 9], seed=2)]
    outs = engine.run(ids)
    assert all(outs[i].error is None for i in ids)
    stats = engine.cache.stats()
    assert engine.cache.staging.high_water >= min(max_num_seqs + 2, 5)  # the rows were really used
    assert stats["kv_staging_bytes"] > 0
    assert stats["kv_bytes_allocated"] <= budget, (stats["kv_bytes_allocated"], budget)
    # and the budget is spent on blocks, not left idle: within a few blocks of it
    assert stats["kv_bytes_allocated"] > budget - 4 * (stats["kv_bytes_per_block"] + 2048)
