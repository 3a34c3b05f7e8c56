"""What `agreement.agree` refuses and accepts, in one process: lists inside the settings compared by content, tensors
by dtype as well as bytes, a differing shard plan refused, each rank's own error first, and `sampling_params`
standing for the model's generation_config (ranks whose models' configs differ but that pass the same
`sampling_params` agree)."""

from __future__ import annotations

import pytest
import torch

import hf_paged
from hf_paged.distributed.agreement import (
    CallSignature,
    agree,
    inputs_digest,
    settings_digests,
    weights_settings,
    wrap_settings,
)
from hf_paged.errors import InvalidConfigError, InvalidPromptError
from tests.tiny_models import tiny_model


def _signature(model, plan: str = "plan", **kwargs) -> CallSignature:
    return CallSignature(1, inputs_digest([[5, 6, 7]]), settings_digests(model, None, kwargs), plan)


def test_a_list_inside_the_sampling_params_is_compared_by_content():
    model = tiny_model("llama")
    one = _signature(model, sampling_params=hf_paged.SamplingParams(max_new_tokens=3, eos_token_id=[5, 6]))
    other = _signature(model, sampling_params=hf_paged.SamplingParams(max_new_tokens=3, eos_token_id=[5, 7]))
    agree([one, one], 0)
    with pytest.raises(InvalidConfigError, match=r"\(sampling_params differ"):
        agree([one, other], 0)


def test_tensors_of_equal_bytes_and_other_dtypes_differ():
    model = tiny_model("llama")
    ints, floats = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.float32)  # the same 16 zero bytes
    assert settings_digests(model, None, {"bias": ints}) != settings_digests(model, None, {"bias": floats})


def test_different_shard_plans_are_refused():
    model = tiny_model("llama")
    with pytest.raises(InvalidConfigError, match="planned different shards"):
        agree([_signature(model, plan="a"), _signature(model, plan="b")], 0)


def test_each_rank_raises_its_own_error_first():
    mine, theirs = InvalidPromptError("mine"), InvalidConfigError("theirs")
    every = [CallSignature(0, "", (), None, theirs), CallSignature(0, "", (), None, mine)]
    with pytest.raises(InvalidPromptError, match="mine"):
        agree(every, 1)
    with pytest.raises(InvalidConfigError, match="theirs"):
        agree(every, 0)


def test_sampling_params_stand_for_the_models_generation_config():
    first, second = tiny_model("llama"), tiny_model("llama")
    second.generation_config.temperature = 0.3  # unused: sampling_params say everything
    params = hf_paged.SamplingParams(max_new_tokens=3)
    agree([_signature(first, sampling_params=params), _signature(second, sampling_params=params)], 0)
    with pytest.raises(InvalidConfigError, match="model.generation_config"):
        agree([_signature(first), _signature(second)], 0)  # no sampling_params: the models' configs count


def test_ranks_wrapped_with_other_settings_are_refused_naming_the_field():
    """h8 (F3): one rank's int4 KV was silently mixed into every rank's outputs (only block_size was compared)."""
    model = tiny_model("llama")

    def signed(config: hf_paged.PagedConfig) -> CallSignature:
        one = _signature(model)
        return CallSignature(1, one.inputs, one.settings + wrap_settings(config), "plan")

    plain, int4 = signed(hf_paged.PagedConfig()), signed(hf_paged.PagedConfig(kv_cache_dtype="int4"))
    with pytest.raises(InvalidConfigError, match=r"\(PagedConfig.kv_cache_dtype: rank 0: 'auto', rank 1: 'int4'\)"
                                                 r".*same hf_paged.wrap options"):
        agree([plain, int4], 0)
    # each rank's own memory and disk tier may differ
    agree([plain, signed(hf_paged.PagedConfig(num_blocks=64, memory_fraction=0.2, kv_offload_dir="/tmp/x"))], 0)


def test_ranks_holding_other_weights_are_refused():
    first, second = tiny_model("llama"), tiny_model("llama", seed=1)
    same = CallSignature(1, "x", weights_settings(first), "plan")
    agree([same, CallSignature(1, "x", weights_settings(tiny_model("llama")), "plan")], 0)
    with pytest.raises(InvalidConfigError, match="the ranks hold different weights"):
        agree([same, CallSignature(1, "x", weights_settings(second), "plan")], 0)
