"""SnapKV / PyramidKV choose the same blocks however the prompt was chunked: the prompt's last 32 queries vote
whichever chunks run them (a query's scores see only the keys up to it), so a prompt whose last chunk holds one
token keeps what it keeps in one chunk, and its tokens are the same (they used to differ from the 2nd token on)."""

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model


def run(model, prompts, policy, **config):
    engine = Engine(model, PagedConfig(block_size=4, kv_pruning=policy, kv_keep_ratio=0.5, num_sink_tokens=4,
                                       window_tokens=8, enable_prefix_caching=False, **config))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=16)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs)
    assert not engine.pruner.pending  # nothing left behind
    return [o.generated_tokens for o in outs], engine.stats()["kv_blocks_evicted"]


@pytest.mark.parametrize("policy", ["snapkv", "pyramidkv"])
def test_tokens_and_drops_are_the_same_for_every_chunking(policy):
    model = tiny_model("llama")
    prompts = ragged_prompts([40, 37, 45], seed=3)
    alone = [run(model, [p], policy, max_num_batched_tokens=256) for p in prompts]  # ([tokens], blocks dropped)
    for budget in (39, 16):  # 39: the 40-token prompt's last chunk is one token; 16: the window spans 2-3 chunks
        for prompt, want in zip(prompts, alone):
            assert run(model, [prompt], policy, max_num_batched_tokens=budget) == want, budget
    got, evicted = run(model, prompts, policy, max_num_batched_tokens=16)
    assert got == [t[0] for t, _ in alone] and evicted == sum(e for _, e in alone)
