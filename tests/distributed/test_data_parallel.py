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
        "one_process_errors": _one_process_errors(model, prompts),
        "stock": stock_greedy(hf_paged.unwrap(model), prompts, MAX_NEW_TOKENS),
    }


def _one_process_errors(model, prompts) -> dict[str, str]:
    n, params = len(prompts), hf_paged.SamplingParams(max_new_tokens=2)
    calls = {"short_priorities_one_rank": lambda: model.generate_batch(prompts, max_new_tokens=2,
                                                                       priorities=[0] * (n - 2)),
             "huge_id_one_rank": lambda: model.generate_batch(prompts[:4] + [[5, 2**64]], max_new_tokens=2),
             "bad_prompt_at_3": lambda: model.generate_batch(prompts[:3] + [[5, 500]] + prompts[4:], max_new_tokens=2),
             "two_sampling_params": lambda: model.generate_batch(prompts, sampling_params=[params] * 2),
             "a_none_sampling_params": lambda: model.generate_batch(prompts, sampling_params=[params] + [None] * (n - 1)),
             "max_new_tokens_list": lambda: model.generate_batch(prompts, max_new_tokens=[2] * n)}
    words = {}
    for case, call in calls.items():
        with pytest.raises(Exception) as caught:  # noqa: PT011 -- the class is compared, with the words
            call()
        words[case] = f"{type(caught.value).__name__}: {caught.value}"
    return words


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


def test_every_argument_is_checked_before_the_exchange_as_one_process_checks_it(data_parallel_ranks, single_process):
    """h8 (F2, F3, F5, F9, F11, F12): the same words on every rank, the ones `model.generate_batch` says in one
    process, naming the caller's index; a short `priorities` or a huge token id on one rank no longer leaves the
    other waiting for the process group's timeout."""
    ranks = data_parallel_ranks
    got = ranks[0]
    for case in ("short_priorities_one_rank", "huge_id_one_rank", "bad_prompt_at_3", "two_sampling_params",
                 "a_none_sampling_params", "max_new_tokens_list", "timestamps", "different_wrap", "different_weights"):
        assert ranks[1][case] == got[case], case
    n = len(dp_prompts())
    assert got["short_priorities_one_rank"] == f"ValueError: priorities must be a list of one int per input ({n}), got {n - 2}"
    assert got["huge_id_one_rank"].startswith("InvalidPromptError: input 4 of generate_batch: token ids [18446744073709551616]")
    assert got["bad_prompt_at_3"].startswith("InvalidPromptError: input 3 of generate_batch: token ids [500] are outside")
    assert got["two_sampling_params"] == f"ValueError: got 2 sampling_params for {n} inputs; give one each"
    assert got["a_none_sampling_params"].startswith("TypeError: sampling_params must be a SamplingParams or a list")
    assert got["max_new_tokens_list"].startswith("InvalidConfigError: SamplingParams.max_new_tokens must be an int")
    assert got["timestamps"] == [2, 2]
    assert got["different_wrap"].startswith(
        "InvalidConfigError: the ranks wrapped the model with different settings (PagedConfig.kv_cache_dtype: "
        "rank 0: 'auto', rank 1: 'int8')")
    assert got["different_weights"].startswith("InvalidConfigError: the ranks hold different weights")
    for case, words in single_process["one_process_errors"].items():  # the words of model.generate_batch alone
        assert got[case] == words, case


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
