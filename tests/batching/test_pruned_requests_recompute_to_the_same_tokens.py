"""SnapKV / PyramidKV under recompute preemption give the tokens a request gives alone. A recompute ran the prompt
and the generated tokens in one chunk: the chunk's last queries (generated positions) voted instead of the prompt's,
and the recomputed tokens attended to the whole prompt, pruned only after the forward; about one request per
preemption generated other tokens (h96's audit). A recompute now stops at the prompt's end, where the prompt is
pruned as the first time, and the generated tokens are computed again over what it kept."""

from __future__ import annotations

import pytest

from tests.cache.engine_parity import engine_tokens
from tests.tiny_models import ragged_prompts, tiny_model

PRUNING = {"block_size": 4, "kv_keep_ratio": 0.5, "num_sink_tokens": 4, "window_tokens": 8,
           "enable_prefix_caching": False}
PROMPTS = ragged_prompts([40, 37, 45, 33], seed=3)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _run(model, prompts, **config):
    tokens, engine = engine_tokens(model, prompts, max_new=24, **(PRUNING | config))
    return tokens, engine.stats()["preemptions"]


@pytest.mark.parametrize("policy", ["snapkv", "pyramidkv"])
@pytest.mark.parametrize("extra", [{"num_blocks": 24, "max_num_batched_tokens": 64},
                                   {"num_blocks": 30, "max_num_batched_tokens": 64},
                                   {"num_blocks": 30, "enable_chunked_prefill": False}])
def test_preempted_and_recomputed_requests_generate_what_they_do_alone(model, policy, extra):
    alone = [_run(model, [p], kv_pruning=policy)[0][0] for p in PROMPTS]
    together, preemptions = _run(model, PROMPTS, kv_pruning=policy, **extra)
    assert preemptions > 0  # the premise: requests were preempted and recomputed
    assert together == alone
