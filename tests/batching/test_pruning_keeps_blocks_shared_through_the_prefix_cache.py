"""SnapKV never drops a block another sequence or the prefix cache shares (selection.py: "only private blocks are
dropped ... kept whatever its score"): a prompt that hits three cached blocks keeps them, past its sinks, even when
its budget has no room left for them, and they count against that budget."""

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model

BS = 4


def test_prefix_hit_blocks_outside_sinks_and_window_survive_pruning():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=BS, kv_pruning="snapkv", kv_keep_ratio=0.25, num_sink_tokens=4,
                                       window_tokens=8))
    base = ragged_prompts([12], seed=4)[0]  # 12 tokens: within sinks + window, nothing pruned, all 3 blocks cached
    first = engine.add_request(base, SamplingParams(max_new_tokens=2))
    assert engine.run([first])[first].error is None and engine.stats()["kv_blocks_evicted"] == 0
    second = engine.add_request(base + ragged_prompts([28], seed=5)[0], SamplingParams(max_new_tokens=3))
    engine.step()  # the 40-token prompt: 3 blocks hit, the rest computed, then pruned to a 3-block budget
    table = engine.kv.block_ids(second)
    cached = engine.kv.prefix_cache.match(base + [0]).block_ids  # the first request's blocks in the prefix cache
    assert len(cached) == 3 and table[:3] == cached  # sink block 0 and the shared blocks 1, 2 stay
    assert len(table) == 3 + 2 and engine.stats()["kv_blocks_evicted"] == 5  # + the 2 window blocks; 5 dropped
    out = engine.run([second])[second]
    assert out.error is None and out.num_cached_tokens == 12
    engine.check_integrity()
