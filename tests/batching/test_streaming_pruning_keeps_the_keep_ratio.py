"""`kv_pruning="streaming"` keeps `kv_keep_ratio` of the prompt (README: "a prompt keeps kv_keep_ratio of its
tokens (or kv_budget_tokens), never fewer than num_sink_tokens + window_tokens"): the sinks plus the most recent
tokens that fill that budget, not only `window_tokens` of them; and as the generation grows it drops one block at a
time, so the table stays within a block of the budget."""

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model

BS = 4


@pytest.mark.parametrize("config, budget_blocks", [
    ({"kv_keep_ratio": 0.5}, 8),  # 64 tokens x 0.5 = 32 tokens = 8 blocks (sinks 4 + window 8 = 3 blocks)
    ({"kv_budget_tokens": 20}, 5),
    ({"kv_keep_ratio": 0.1}, 3),  # 6.4 tokens < sinks + window: the floor, 12 tokens = 3 blocks
])
def test_streaming_keeps_its_budget_of_sinks_and_recent_tokens(config, budget_blocks):
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=BS, kv_pruning="streaming", num_sink_tokens=4, window_tokens=8,
                                       max_num_batched_tokens=64, enable_prefix_caching=False, **config))
    prompt = ragged_prompts([64], seed=6)[0]
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=12))
    engine.step()  # the whole prompt in one step, pruned after it
    table = engine.kv.block_ids(rid)
    dropped = engine.kv.num_dropped_tokens(rid)
    assert len(table) == budget_blocks and dropped == 64 - budget_blocks * BS
    pruned_after_prompt = engine.stats()["kv_blocks_evicted"]
    sizes = []
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
        if rid in engine.kv.seqs:
            sizes.append(len(engine.kv.block_ids(rid)))
    assert engine.pop_output(rid).error is None
    assert max(sizes) == budget_blocks + 1  # the block being written beside a full budget
    assert engine.stats()["kv_blocks_evicted"] > pruned_after_prompt  # pruned again as it grew
