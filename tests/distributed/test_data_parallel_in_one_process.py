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
