"""Generation over 2 gloo processes on CPU (torchrun): the same outputs as one process, on every rank."""

from __future__ import annotations

import pytest
import torch

import hf_paged
from hf_paged.distributed import generate_batch, run_sharded
from hf_paged.errors import InvalidConfigError
from tests.distributed.cases import (
    BLOCK_SIZE,
    MAX_NEW_TOKENS,
    dp_prompts,
    dp_sampling_params,
    output_fields,
    tokens,
)
from tests.distributed.launch import run_ranks
from tests.tiny_models import stock_greedy, tiny_model


@pytest.fixture(scope="module")
def single_process():
    """The references: one process, the whole list through the wrapped model's own generate_batch."""
    model = hf_paged.wrap(tiny_model("llama"), block_size=BLOCK_SIZE)
    prompts = dp_prompts()
    return {
        "greedy": tokens(model.generate_batch(prompts, max_new_tokens=MAX_NEW_TOKENS)),
        "sampled": tokens(model.generate_batch(prompts, sampling_params=dp_sampling_params())),
        "fields": output_fields(model.generate_batch(prompts, sampling_params=hf_paged.SamplingParams(
            max_new_tokens=3, logprobs=2, output_scores=True))),
        "stock": stock_greedy(hf_paged.unwrap(model), prompts, MAX_NEW_TOKENS),
    }


@pytest.fixture(scope="module")
def data_parallel_ranks(tmp_path_factory) -> list[dict]:
    return run_ranks("data_parallel", tmp_path_factory.mktemp("data_parallel"))


def test_two_ranks_generate_what_one_process_does(data_parallel_ranks, single_process):
    ranks = data_parallel_ranks
    assert ranks[0] == ranks[1]  # every rank holds every output, in input order
    got = ranks[0]
    assert list(got["greedy"]) == [f"req_{i}" for i in range(len(dp_prompts()))]
    assert got["greedy"] == single_process["greedy"]
    assert list(got["greedy"].values()) == single_process["stock"]
    # seeded sampling with forks: the same tokens and names (forks after their parent) as one process
    assert list(got["sampled"]) == list(single_process["sampled"])
    assert got["sampled"] == single_process["sampled"]
    # both ranks worked; each system prompt's group stayed on one rank
    rank_of = got["rank_of"]
    assert len(set(rank_of[:4])) == 1 and len(set(rank_of[4:6])) == 1 and set(rank_of) == {0, 1}
    assert all(n > 0 for n in got["generated_by_rank"]) and got["num_seconds"] == 2
    # a failure on one rank raises on both (nobody hangs); so do different inputs per rank; the engine is whole
    assert got["bad_input"] == "InvalidPromptError"
    assert got["different_inputs"] == "InvalidConfigError"
    assert got["different_budgets"] == "InvalidConfigError"
    assert got["after_errors"] == {k: single_process["greedy"][k] for k in ("req_0", "req_1", "req_2")}
    assert got["method"] == single_process["greedy"]  # model.generate_batch(..., distributed=True)


def test_two_ranks_refuse_alike_what_one_rank_cannot_run(data_parallel_ranks, single_process):
    """A rank that fails before generating, or ranks given different settings: the same error on every rank (before
    the fix, the others waited in the input check for the rank that had raised, or mixed shards sampled otherwise)."""
    ranks = data_parallel_ranks
    assert ranks[0] == ranks[1]
    got = ranks[0]
    assert got["bad_input_one_rank"] == "InvalidPromptError"
    assert got["short_sampling_params_one_rank"] == "ValueError"
    for case in ("different_temperature", "different_seed", "greedy_on_one_rank"):
        assert got[case] == "InvalidConfigError", case
    assert got["progress_bar_on_rank_0"] == {k: v[:2] for k, v in list(single_process["greedy"].items())[:2]}
    assert got["no_inputs"] == {}
    assert got["one_input"] == {"req_0": single_process["greedy"]["req_5"]}
    assert got["fields"] == single_process["fields"]
    assert {o["finish_reason"] for o in got["fields"].values()} == {"length"}
    assert all(o["num_scores"] == 3 and len(o["top"][0]) == 2 for o in got["fields"].values())


def test_accelerate_launch_without_process_group(tmp_path, single_process):
    """Nothing initialised by the script: accelerate's PartialState sets up the job at the first call."""
    ranks = run_ranks("accelerate_launch", tmp_path)
    assert ranks[0] == ranks[1]
    assert ranks[0]["greedy"] == single_process["greedy"]
    assert ranks[0]["backend"] == "gloo" and ranks[0]["num_processes"] == 2


def test_one_process_is_the_models_own_generate_batch(single_process):
    model = hf_paged.wrap(tiny_model("llama"), block_size=BLOCK_SIZE)
    run = run_sharded(model, dp_prompts(), max_new_tokens=MAX_NEW_TOKENS)
    assert tokens(run.outputs) == single_process["greedy"]
    assert run.plan.rank_of == (0,) * len(dp_prompts()) and len(run.seconds) == 1
    assert run.engine_stats[0]["generated_tokens"] == MAX_NEW_TOKENS * len(dp_prompts())
    hf_paged.engine_of(model).check_integrity()


def test_unwrapped_model_is_refused():
    with pytest.raises(InvalidConfigError, match="wrap"):
        generate_batch(tiny_model("llama"), [[5, 6, 7]], max_new_tokens=2)


def test_a_model_inside_data_parallel_names_its_module():
    """DDP (here its single-process cousin DataParallel, no process group needed) holds the model in `.module`."""
    holder = torch.nn.DataParallel(tiny_model("llama"))
    with pytest.raises(hf_paged.errors.UnsupportedModelError, match=r"hf_paged.wrap\(model.module\)"):
        hf_paged.wrap(holder)
    with pytest.raises(InvalidConfigError, match=r"DataParallel holds, wrapped: hf_paged.wrap\(model.module\)"):
        generate_batch(holder, [[5, 6, 7]], max_new_tokens=2)
    hf_paged.wrap(holder.module, block_size=BLOCK_SIZE)
    assert tokens(generate_batch(holder.module, [[5, 6, 7]], max_new_tokens=2)) == tokens(
        holder.module.generate_batch([[5, 6, 7]], max_new_tokens=2))
