"""`weights_fingerprint` reads a few values of the first, the middle and the last parameter: an edit through `.data`
(no version counter moves, no optimizer step) of any of the three is seen, and so the engine drops its prefix cache
after it without a `weights_changed()` call."""

from __future__ import annotations

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.weights import weights_fingerprint
from tests.tiny_models import tiny_model


def _params(model) -> list[torch.Tensor]:
    # the fingerprint's own walk: each module's own parameters, in module order
    return [p for module in model.modules() for p in module.parameters(recurse=False)]


@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_a_data_edit_of_a_sampled_parameter_is_seen(which):
    model = tiny_model("llama")
    params = _params(model)
    param = {"first": params[0], "middle": params[len(params) // 2], "last": params[-1]}[which]
    before = weights_fingerprint(model)
    param.data.view(-1)[0] += 1.0  # the first value is always sampled
    after = weights_fingerprint(model)
    assert after.values != before.values and after.weights == before.weights


def test_the_engine_drops_its_prefix_cache_after_a_data_edit_of_the_head():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=4))
    prompt = list(range(3, 15))

    def cached() -> int:
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=2))
        return engine.run([rid])[rid].num_cached_tokens

    cached()
    assert cached() > 0  # the same weights: the prompt's blocks are reused
    model.lm_head.weight.data[0, 0] += 1.0  # the last parameter, through .data
    assert cached() == 0  # nothing reused from before the edit
