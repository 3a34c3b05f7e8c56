"""`data_parallel`'s pieces in one process: each input's output budget counts its forks, a rank's shard takes its own
inputs' per-input `priorities` (as it does `sampling_params`), and weights sharded by FSDP are refused before any
work (a rank running other prompts would wait on the others' gathers for ever)."""

from __future__ import annotations

import pytest
import torch

import hf_paged
from hf_paged.distributed import run_sharded
from hf_paged.distributed.data_parallel import _output_budgets, _run_local
from tests.tiny_models import ragged_prompts, tiny_model


def test_output_budgets_count_every_fork():
    model = tiny_model("llama")
    params = [hf_paged.SamplingParams(max_new_tokens=4, num_return_sequences=3, do_sample=True),
              hf_paged.SamplingParams(max_new_tokens=5)]
    assert _output_budgets(model, [[1], [2]], None, {"sampling_params": params}) == [12, 5]
    assert _output_budgets(model, [[1], [2]], None, {"max_new_tokens": 6}) == [6, 6]


def test_a_shard_takes_its_own_inputs_priorities():
    model = hf_paged.wrap(tiny_model("llama"), block_size=4)
    prompts = ragged_prompts([5, 3, 7], seed=2)
    result = _run_local(model, hf_paged.engine_of(model), prompts, [0, 2], None, 1,
                        {"max_new_tokens": 2, "priorities": [3, 1, 2]})
    assert result.error is None
    assert sorted(o.request_id for o in result.outputs) == ["req_0", "req_2"]


class FullyShardedDataParallel(torch.nn.Module):  # what FSDP 1 wraps a module in (the check reads the class name)
    def __init__(self, inner):
        super().__init__()
        self.inner = inner


def test_fsdp_sharded_weights_are_refused():
    model = hf_paged.wrap(tiny_model("llama"), block_size=4)
    model.model.layers[0].mlp = FullyShardedDataParallel(model.model.layers[0].mlp)
    with pytest.raises(hf_paged.errors.UnsupportedModelError, match="FSDP"):
        run_sharded(model, [[5, 6, 7]], max_new_tokens=2)


def test_output_budgets_refuse_what_generate_batch_refuses():
    """h8 (F5): "got 2 max_new_tokens for 5 prompts", an AttributeError for a None entry, a TypeError from int()."""
    model, prompts = tiny_model("llama"), [[1], [2], [3]]
    params = hf_paged.SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match=r"^got 2 sampling_params for 3 inputs; give one each$"):
        _output_budgets(model, prompts, None, {"sampling_params": [params] * 2})
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams or a list of them"):
        _output_budgets(model, prompts, None, {"sampling_params": [params, None, params]})
    with pytest.raises(hf_paged.errors.InvalidConfigError, match=r"max_new_tokens must be an int >= 1, got \[1, 2\]"):
        _output_budgets(model, prompts, None, {"max_new_tokens": [1, 2]})


def test_one_process_keeps_record_timestamps():
    """h8 (F11): `distributed=True` dropped record_timestamps, even in one process."""
    model = hf_paged.wrap(tiny_model("llama"), block_size=4)
    outputs = model.generate_batch(ragged_prompts([5, 3], seed=1), max_new_tokens=3, record_timestamps=True,
                                   distributed=True)
    assert [len(o.timestamps) for o in outputs.values()] == [3, 3]


def test_a_short_priorities_list_is_refused_before_any_rank_uses_it():
    """h8 (F2): the rank whose shard ran past its end raised a bare IndexError outside the shared exchange."""
    model = hf_paged.wrap(tiny_model("llama"), block_size=4)
    with pytest.raises(ValueError, match=r"priorities must be a list of one int per input \(3\), got 2"):
        run_sharded(model, [[5, 6], [7, 8], [9, 10]], max_new_tokens=2, priorities=[1, 2])
