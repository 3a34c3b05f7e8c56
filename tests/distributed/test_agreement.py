"""The pre-generation agreement between ranks, without processes: digests of the settings, and `agree`'s verdicts."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, TemperatureLogitsWarper

import hf_paged
from hf_paged.distributed.agreement import CallSignature, agree, inputs_digest, settings_digests
from hf_paged.errors import InvalidConfigError, InvalidPromptError
from tests.tiny_models import tiny_model


def _signature(model, generation_config=None, prompts=((5, 6, 7),), **kwargs) -> CallSignature:
    return CallSignature(len(prompts), inputs_digest(prompts), settings_digests(model, generation_config, kwargs),
                         "plan")


def test_equal_settings_agree_and_rank_local_ones_are_ignored():
    model = tiny_model("llama")
    a = _signature(model, GenerationConfig(do_sample=True, temperature=0.7), max_new_tokens=4, progress_bar=True)
    b = _signature(model, GenerationConfig(do_sample=True, temperature=0.7), max_new_tokens=4, progress_bar=False)
    agree([a, b], 1)
    params = [hf_paged.SamplingParams(max_new_tokens=3, seed=i, logits_processors=[TemperatureLogitsWarper(0.5)])
              for i in range(2)]
    # processors compare by class (they may hold per-rank state), values by content
    same = [hf_paged.SamplingParams(max_new_tokens=3, seed=i, logits_processors=[TemperatureLogitsWarper(0.9)])
            for i in range(2)]
    agree([_signature(model, sampling_params=params), _signature(model, sampling_params=same)], 0)


@pytest.mark.parametrize(("other", "named"), [
    ({"generation_config": GenerationConfig(do_sample=True, temperature=1.5), "max_new_tokens": 4},
     "generation_config"),
    ({"generation_config": GenerationConfig(do_sample=True, temperature=0.7), "max_new_tokens": 5}, "max_new_tokens"),
    ({"generation_config": None, "max_new_tokens": 4}, "generation_config, model.generation_config"),
])
def test_different_settings_are_refused_naming_them(other, named):
    model = tiny_model("llama")
    mine = _signature(model, GenerationConfig(do_sample=True, temperature=0.7), max_new_tokens=4)
    with pytest.raises(InvalidConfigError, match=rf"different generation settings \({named} differ"):
        agree([mine, _signature(model, **other)], 0)


def test_seeds_and_inputs_and_failures():
    model = tiny_model("llama")
    seeded = [_signature(model, sampling_params=hf_paged.SamplingParams(do_sample=True, seed=s)) for s in (1, 2)]
    with pytest.raises(InvalidConfigError, match=r"\(sampling_params differ"):
        agree(seeded, 0)
    with pytest.raises(InvalidConfigError, match="different inputs"):
        agree([_signature(model, prompts=((5, 6),)), _signature(model, prompts=((5, 7),))], 1)
    failed = CallSignature(0, "", (), None, InvalidPromptError("input 3 is not token ids"))
    with pytest.raises(InvalidPromptError, match="input 3") as raised:
        agree([_signature(model), failed], 0)  # the other rank's error, on this rank
    assert "rank 1 of 2" in raised.value.__notes__[0]


def test_tensor_settings_of_any_dtype_are_compared_by_content():
    """A bfloat16 tensor among the settings (numpy has no bfloat16: `.numpy()` raised) and a non-contiguous one."""
    model = tiny_model("llama")
    bias = torch.tensor([0.5, -1.0], dtype=torch.bfloat16)
    same = settings_digests(model, None, {"bias": bias.clone()})
    assert settings_digests(model, None, {"bias": bias}) == same
    assert settings_digests(model, None, {"bias": bias * 2}) != same
    ids = torch.tensor([[1, 2], [3, 4]])
    assert settings_digests(model, None, {"ids": ids.t()}) == settings_digests(model, None, {"ids": ids.t().clone()})
