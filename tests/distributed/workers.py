"""The rank side of the multi-process tests, run by `launch.run_ranks`:

    torchrun --standalone --nproc_per_node 2 -m tests.distributed.workers CASE OUT_DIR [MODEL_DIR]

Each rank writes what it saw to OUT_DIR/rank<r>.json; the test compares the ranks with each other and with a
single-process run. Errors are recorded by class name (an error is chosen by its class, never by its words).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GenerationConfig

import hf_paged
from hf_paged.distributed import generate_batch, run_sharded
from tests.distributed.cases import (
    BLOCK_SIZE,
    MAX_NEW_TOKENS,
    TP_FAMILIES,
    callback_prompts,
    dp_prompts,
    dp_sampling_params,
    output_fields,
    tokens,
    tp_prompts,
    tp_sampling_params,
)
from tests.tiny_models import stock_greedy, tiny_model


def _error_of(fn) -> str | None:
    try:
        fn()
    except hf_paged.errors.HfPagedError as error:
        return type(error).__name__
    return None


def data_parallel(args: list[str]) -> dict:
    """torch.distributed initialised by the script itself (gloo)."""
    dist.init_process_group("gloo")
    model = hf_paged.wrap(tiny_model("llama"), block_size=BLOCK_SIZE)
    prompts = dp_prompts()
    run = run_sharded(model, prompts, max_new_tokens=MAX_NEW_TOKENS)
    result = {
        "greedy": tokens(run.outputs), "rank_of": list(run.plan.rank_of), "num_tokens": list(run.plan.num_tokens),
        "generated_by_rank": [s.get("generated_tokens", 0) for s in run.engine_stats],
        "num_seconds": len(run.seconds),
        "sampled": tokens(generate_batch(model, prompts, sampling_params=dp_sampling_params())),
        # an input outside the vocabulary fails on the rank that holds it, and every rank raises its error
        "bad_input": _error_of(lambda: generate_batch(model, prompts[:4] + [[10_000]], max_new_tokens=2)),
        # a per-rank split given by mistake (different inputs on each rank) is refused on every rank
        "different_inputs": _error_of(lambda: generate_batch(model, prompts[: 4 + dist.get_rank()], max_new_tokens=2)),
        # the same inputs with another output budget on each rank (each rank plans its shard alone) is refused too
        "different_budgets": _error_of(
            lambda: generate_batch(model, prompts, max_new_tokens=2 + 3 * dist.get_rank())),
    }
    result.update(_hostile_calls(model, prompts))
    result.update(_checked_before_the_exchange(model, prompts))
    hf_paged.engine_of(model).check_integrity()
    result["after_errors"] = tokens(generate_batch(model, prompts[:3], max_new_tokens=MAX_NEW_TOKENS))
    # the wrapped model's own generate_batch, asked to spread the work
    result["method"] = tokens(model.generate_batch(prompts, max_new_tokens=MAX_NEW_TOKENS, distributed=True))
    return result


def _class_of_error(fn) -> str | None:
    """The class of whatever `fn` raised (plain ValueErrors included), None when it returned."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001 -- recorded by class, compared across ranks by the test
        return type(error).__name__
    return None


def _hostile_calls(model, prompts: list[list[int]]) -> dict:
    """Calls that differ between ranks, or that fail on one rank before it generates: every rank must raise the
    same error class (none may wait in a collective for a rank that already raised), and a silent mix of shards
    generated with different settings must be refused."""
    rank, sampled = dist.get_rank(), hf_paged.SamplingParams(max_new_tokens=2, do_sample=True, seed=5)
    return {
        # a rank that fails before it generates (its inputs are not token ids; a per-input list of the wrong length)
        "bad_input_one_rank": _class_of_error(
            lambda: generate_batch(model, prompts[:3] + [[5, 6] if rank == 0 else "text"], max_new_tokens=2)),
        "short_sampling_params_one_rank": _class_of_error(
            lambda: generate_batch(model, prompts, sampling_params=[sampled] * (len(prompts) - rank))),
        # the same inputs, other settings on one rank: each rank would generate its shard otherwise
        "different_temperature": _class_of_error(lambda: generate_batch(
            model, prompts, GenerationConfig(do_sample=True, temperature=0.5 + rank, max_new_tokens=2))),
        "different_seed": _class_of_error(lambda: generate_batch(
            model, prompts, sampling_params=hf_paged.SamplingParams(max_new_tokens=2, do_sample=True, seed=rank))),
        "greedy_on_one_rank": _class_of_error(
            lambda: generate_batch(model, prompts, max_new_tokens=2, do_sample=bool(rank))),
        # what only shows on one rank may differ; no inputs, and fewer inputs than ranks, are answered on every rank
        "progress_bar_on_rank_0": tokens(generate_batch(model, prompts[:2], max_new_tokens=2,
                                                        progress_bar=rank == 0)),
        "no_inputs": tokens(generate_batch(model, [], max_new_tokens=2)),
        "one_input": tokens(generate_batch(model, prompts[5:6], max_new_tokens=MAX_NEW_TOKENS)),
        # logprobs, scores and finish reasons come back through the gather
        "fields": output_fields(generate_batch(model, prompts, sampling_params=hf_paged.SamplingParams(
            max_new_tokens=3, logprobs=2, output_scores=True))),
    }


def _words_of_error(fn) -> str | None:
    """`"<class>: <message>"` of whatever `fn` raised (the ranks must raise the same words), None when it returned."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001 -- compared across ranks and with one process by the test
        return f"{type(error).__name__}: {error}"
    return None


def _checked_before_the_exchange(model, prompts: list[list[int]]) -> dict:
    """h8: arguments used before the exchange (a short `priorities` hung the other rank for the process group's
    timeout; a token id >= 2**63 gave a bare OverflowError on one rank) or checked by using them (a wrong-length
    `sampling_params` named max_new_tokens; a bad prompt was named by its place in a shard); a `record_timestamps`
    dropped; ranks wrapped with other PagedConfig settings or holding other weights, silently mixed."""
    rank, n = dist.get_rank(), len(prompts)
    other_wrap = hf_paged.wrap(tiny_model("llama"), block_size=BLOCK_SIZE, kv_cache_dtype="int8" if rank else "auto")
    other_weights = hf_paged.wrap(tiny_model("llama", seed=rank), block_size=BLOCK_SIZE)
    timed = model.generate_batch(prompts[:2], max_new_tokens=2, record_timestamps=True, distributed=True)
    return {
        "short_priorities_one_rank": _words_of_error(
            lambda: generate_batch(model, prompts, max_new_tokens=2, priorities=[0] * (n - 2 * rank))),
        "huge_id_one_rank": _words_of_error(
            lambda: generate_batch(model, prompts[:4] + [[5, 2**64 if rank else 6]], max_new_tokens=2)),
        "bad_prompt_at_3": _words_of_error(
            lambda: generate_batch(model, prompts[:3] + [[5, 500]] + prompts[4:], max_new_tokens=2)),
        "two_sampling_params": _words_of_error(lambda: generate_batch(
            model, prompts, sampling_params=[hf_paged.SamplingParams(max_new_tokens=2)] * 2)),
        "a_none_sampling_params": _words_of_error(lambda: generate_batch(
            model, prompts, sampling_params=[hf_paged.SamplingParams(max_new_tokens=2), None] + [None] * (n - 2))),
        "max_new_tokens_list": _words_of_error(lambda: generate_batch(model, prompts, max_new_tokens=[2] * n)),
        "timestamps": [len(o.timestamps) for o in timed.values()],
        "different_wrap": _words_of_error(lambda: generate_batch(other_wrap, prompts, max_new_tokens=2)),
        "different_weights": _words_of_error(lambda: generate_batch(other_weights, prompts, max_new_tokens=2)),
    }


def accelerate_launch(args: list[str]) -> dict:
    """Nothing initialised (as under `accelerate launch` before an Accelerator exists): accelerate's PartialState
    is set up by the first call."""
    assert not dist.is_initialized()
    model = hf_paged.wrap(tiny_model("llama"), block_size=BLOCK_SIZE)
    outputs = generate_batch(model, dp_prompts(), max_new_tokens=MAX_NEW_TOKENS)
    from accelerate import PartialState

    return {"greedy": tokens(outputs), "backend": dist.get_backend(), "num_processes": PartialState().num_processes}


class _RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 24, seed: int = 0):
        self.rows = torch.randint(3, 96, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def callback(args: list[str]) -> dict:
    """A real Trainer in DDP over 2 CPU processes (gloo), evaluating twice with the paged callback."""
    from transformers import Trainer, TrainingArguments

    from hf_paged.integrations import PagedGenerationCallback

    model, prompts = tiny_model("llama"), callback_prompts()

    def matches_stock(texts, references):
        """Stock greedy on this rank's weights of the moment (DDP keeps them equal on every rank)."""
        was_wrapped = hf_paged.is_wrapped(model)
        expected = stock_greedy(hf_paged.unwrap(model), prompts, MAX_NEW_TOKENS)
        if was_wrapped:
            hf_paged.wrap(model, block_size=BLOCK_SIZE)
        return float([[int(t) for t in text.split()] for text in texts] == expected)

    paged = PagedGenerationCallback(prompts, metric=matches_stock, max_new_tokens=MAX_NEW_TOKENS,
                                    paged_config=hf_paged.PagedConfig(block_size=BLOCK_SIZE))
    out = Path(args[0]) / f"trainer{os.environ['RANK']}"
    targs = TrainingArguments(output_dir=str(out), max_steps=4, eval_strategy="steps", eval_steps=2,
                              per_device_train_batch_size=2, per_device_eval_batch_size=2, learning_rate=5e-2,
                              report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
                              ddp_backend="gloo")
    trainer = Trainer(model=model, args=targs, train_dataset=_RandomTokens(16),
                      eval_dataset=_RandomTokens(4, seed=1), callbacks=[paged])
    trainer.train()
    return {
        "world_size": dist.get_world_size(),
        "tokens": [h["tokens"] for h in paged.history],
        "metrics": [h["metrics"] for h in paged.history],
        "generated_by_rank": [[s.get("generated_tokens", 0) for s in h["engine_stats_by_rank"]] for h in paged.history],
        "logged": [{k: v for k, v in h.items() if k.startswith("eval_generation")}
                   for h in trainer.state.log_history if "eval_generation_matches_stock" in h],
        "wrapped_after": hf_paged.is_wrapped(model),
    }


def tensor_parallel(args: list[str]) -> dict:
    """Each family loaded with tp_plan="auto" (transformers initialises gloo from torchrun's environment)."""
    from transformers import AutoModelForCausalLM

    root, result = Path(args[1]), {}
    for family in TP_FAMILIES:
        model = AutoModelForCausalLM.from_pretrained(root / family, tp_plan="auto", dtype=torch.float32)
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
        hf_paged.wrap(model, block_size=BLOCK_SIZE)  # default pool size: agreed by the ranks, local heads counted
        engine = hf_paged.engine_of(model)
        entry = {
            "tp_size": hf_paged.distributed.tensor_parallel_size(model),
            "local_kv_heads": hf_paged.distributed.local_kv_heads(model),
            "greedy": tokens(model.generate_batch(tp_prompts(), max_new_tokens=MAX_NEW_TOKENS)),
            "num_blocks": engine.cache.num_blocks,
            "key_storage_shape": list(engine.cache.layers[0].key_cache.shape),
            "distributed": tokens(generate_batch(model, tp_prompts(), max_new_tokens=MAX_NEW_TOKENS)),
            # seeded sampling draws the same on every rank (each rank samples from the same all-reduced logits)
            "sampled": tokens(model.generate_batch(tp_prompts(), sampling_params=tp_sampling_params())),
        }
        # unseeded draws from generators seeded differently on each rank: every rank takes the first rank's tokens
        torch.manual_seed(1000 + dist.get_rank())
        entry["unseeded"] = tokens(model.generate_batch(
            tp_prompts(), GenerationConfig(do_sample=True, max_new_tokens=MAX_NEW_TOKENS, top_k=0)))
        # ... which does not reach speculative drafts and verdicts: unseeded sampled speculation is refused
        entry["unseeded_speculative"] = _error_of(lambda m=model: m.generate(
            torch.tensor(tp_prompts()[:1]), do_sample=True, max_new_tokens=4, prompt_lookup_num_tokens=2))
        engine.check_integrity()
        hf_paged.unwrap(model)
        # a budget in bytes buys blocks of the local KV heads: 2 layers x K and V x 4 slots x 1 head x 8 x fp32
        hf_paged.wrap(model, block_size=BLOCK_SIZE, max_cache_bytes=16 * 512, max_num_batched_tokens=16)
        entry["small_pool"] = tokens(model.generate_batch(tp_prompts(), max_new_tokens=MAX_NEW_TOKENS))
        entry["small_pool_blocks"] = hf_paged.engine_of(model).cache.num_blocks
        entry["preemptions"] = hf_paged.engine_of(model).stats()["preemptions"]
        hf_paged.unwrap(model)
        entry["head_table"] = _error_of(
            lambda m=model: hf_paged.wrap(m, kv_cache_dtype="int8", kv_full_precision_heads=((0,), ())))
        entry["snapkv"] = _error_of(lambda m=model: hf_paged.wrap(m, kv_pruning="snapkv", kv_keep_ratio=0.5))
        result[family] = entry
    odd = AutoModelForCausalLM.from_pretrained(root / "llama_odd_kv_heads", tp_plan="auto", dtype=torch.float32)
    result["odd_kv_heads"] = _error_of(lambda: hf_paged.wrap(odd))
    return result


def tensor_parallel_criteria(args: list[str]) -> dict:
    """Stopping criteria whose verdicts differ by rank (each rank's clock, a rank's own state): every rank takes the
    first rank's, so the ranks' engines run the same steps (else one rank's extra forward pairs its collectives with
    the other rank's next call)."""
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    model = AutoModelForCausalLM.from_pretrained(Path(args[1]) / "llama", tp_plan="auto", dtype=torch.float32)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    hf_paged.wrap(model, block_size=BLOCK_SIZE)
    rank, prompt = dist.get_rank(), torch.tensor(tp_prompts()[:1])

    class OnRank(StoppingCriteria):
        def __init__(self, stop_rank: int, raises: bool = False):
            self.stop_rank, self.raises = stop_rank, raises

        def __call__(self, input_ids, scores, **kwargs):
            if rank == self.stop_rank and input_ids.shape[1] >= prompt.shape[1] + 3:
                if self.raises:
                    raise RuntimeError(f"criterion failed on rank {rank}")
                return torch.ones(input_ids.shape[0], dtype=torch.bool)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def generate(criterion) -> list | str:  # back to back: the caller drives every step (`EngineLoop._callers_drive`)
        try:
            return model.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                  stopping_criteria=StoppingCriteriaList([criterion])).tolist()
        except hf_paged.errors.HfPagedError as error:
            return type(error).__name__

    result = {name: generate(criterion) for name, criterion in (
        ("stops_on_rank_0", OnRank(0)), ("stops_on_rank_1", OnRank(1)), ("raises_on_rank_0", OnRank(0, True)),
        ("raises_on_rank_1", OnRank(1, True)))}
    result["after"] = tokens(model.generate_batch(tp_prompts(), max_new_tokens=MAX_NEW_TOKENS))

    async def stream_one():  # requests arriving on their own: the ranks could not run them in the same steps
        async for _ in hf_paged.engine_of(model).loop.generate_async(tp_prompts()[0], hf_paged.SamplingParams()):
            break

    result["generate_async"] = _error_of(lambda: asyncio.run(stream_one()))
    hf_paged.engine_of(model).check_integrity()
    return result


def lm_eval_task_manager():
    """Our task folder alone: its tasks are self-contained, so lm-eval's ~14,700 bundled task files are not parsed
    (`include_defaults=False`; 8-13 s a process on 2 cores, in each rank and in the test's own process)."""
    from lm_eval.tasks import TaskManager

    from hf_paged.api.models import DEFAULT_MODEL_PATH

    return TaskManager(include_path=str(DEFAULT_MODEL_PATH.parent / "lm_eval_tasks"), include_defaults=False)


def lm_eval_ranks(args: list[str]) -> dict:
    """`simple_evaluate(model="hf-paged")` on every rank: each scores its share; rank 0 gets every sample."""
    import lm_eval

    import hf_paged.integrations.lm_eval  # noqa: F401 -- registers hf-paged
    from hf_paged.api.models import DEFAULT_MODEL_PATH

    out = lm_eval.simple_evaluate(
        model="hf-paged", model_args=f"pretrained={DEFAULT_MODEL_PATH},dtype=float32", tasks=args[1].split(","),
        task_manager=lm_eval_task_manager(), limit=int(args[2]),
        device="cpu", log_samples=True)
    if out is None:  # ranks other than 0
        return {"rank": dist.get_rank(), "results": None}
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "results": {t: {k: v for k, v in r.items() if "," in k} for t, r in out["results"].items()},
            "resps": {t: {str(s["doc_id"]): s["resps"] for s in samples} for t, samples in out["samples"].items()}}


def tensor_parallel_both(args: list[str]) -> dict:
    """`tensor_parallel`, then `tensor_parallel_criteria`, in one launch (torchrun and two ranks importing torch and
    transformers cost as much again as either case); each loads its own models, as alone."""
    return {"tensor_parallel": tensor_parallel(args), "criteria": tensor_parallel_criteria(args)}


CASES = {f.__name__: f for f in (data_parallel, accelerate_launch, callback, tensor_parallel, tensor_parallel_criteria,
                                  tensor_parallel_both, lm_eval_ranks)}


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    try:
        result = CASES[case](sys.argv[2:])
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
