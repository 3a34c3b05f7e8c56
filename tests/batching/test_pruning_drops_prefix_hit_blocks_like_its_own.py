"""SnapKV drops a block a prefix hit served like one the prompt computed (the table lets go of its reference; the
prefix cache keeps the block): a prompt keeps the same blocks whatever the cache held when it started. Before the h5
pass a shared block was kept whatever its score and took the budget, and greedy output depended on prefix hits."""

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model

BS = 4


def test_prefix_hit_blocks_outside_sinks_and_window_are_pruned():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=BS, kv_pruning="snapkv", kv_keep_ratio=0.25, num_sink_tokens=4,
                                       window_tokens=8))
    base = ragged_prompts([12], seed=4)[0]  # 12 tokens: within sinks + window, nothing pruned, all 3 blocks cached
    first = engine.add_request(base, SamplingParams(max_new_tokens=2))
    assert engine.run([first])[first].error is None and engine.stats()["kv_blocks_evicted"] == 0
    second = engine.add_request(base + ragged_prompts([28], seed=5)[0], SamplingParams(max_new_tokens=3))
    engine.step()  # the 40-token prompt: 2 blocks hit (its last 32 queries vote), then pruned to a 3-block budget
    table = engine.kv.block_ids(second)
    cached = engine.kv.prefix_cache.match(base + [0]).block_ids  # the first request's blocks in the prefix cache
    assert len(cached) == 3 and table[0] == cached[0] and cached[1] not in table  # sink kept, shared block 1 dropped
    assert len(table) == 3 and engine.stats()["kv_blocks_evicted"] == 7  # sink + the 2 window blocks
    assert engine.kv.prefix_cache.match(base + [0]).num_tokens == 12  # the cache still serves the dropped block
    out = engine.run([second])[second]
    assert out.error is None and out.num_cached_tokens == 8
    engine.check_integrity()
