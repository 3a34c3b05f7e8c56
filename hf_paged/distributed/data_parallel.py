"""Generate over every rank of a `torch.distributed` job (`torchrun`, `accelerate launch`): shard, run, gather.

    every rank: the same inputs ─ plan_shards (no communication) ─ its own engine on its shard
                                                                   └─ all_gather_object ─ all outputs, input order

Every rank must call with the same inputs and generation settings (checked: one small collective before any work,
`agreement`). A rank that fails, getting ready or generating, makes every rank raise the same error (the exchange
and the results carry errors too, so no rank is left waiting in a collective). Under
tensor parallelism (`from_pretrained(..., tp_plan="auto")` over the whole world) nothing is sharded: the ranks
compute every request together, and each already holds all outputs.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hf_paged.api.generate_inputs import check_priorities, per_input_params, token_ids_of
from hf_paged.api.wrap_state import engine_of, is_wrapped
from hf_paged.batching.request import RequestOutput, fork_parent
from hf_paged.batching.sampling import SamplingParams
from hf_paged.distributed.agreement import (
    CallSignature,
    agree,
    exchange,
    inputs_digest,
    raise_any_error,
    settings_digests,
    weights_settings,
    wrap_settings,
)
from hf_paged.distributed.sharding import ShardPlan, plan_shards
from hf_paged.distributed.tensor_parallel import tensor_parallel_size
from hf_paged.errors import InvalidConfigError, UnsupportedGenerationError, UnsupportedModelError

__all__ = ["DistributedRun", "generate_batch", "run_sharded", "world"]


@dataclass(slots=True)
class DistributedRun:
    """One `run_sharded` call, as every rank sees it."""

    outputs: dict[str, RequestOutput]  # every input's outputs in input order (`req_0`, `req_0__child#0`, `req_1`...)
    plan: ShardPlan  # who generated what (one shard holding everything under tensor parallelism)
    seconds: tuple[float, ...]  # each rank's time in its own `generate_batch`
    engine_stats: tuple[dict, ...]  # each rank's engine statistics after its shard


@dataclass(slots=True)
class _RankResult:
    outputs: list[RequestOutput] | None  # this rank's shard, renamed to input indices; None under tensor parallel
    seconds: float
    engine_stats: dict
    error: BaseException | None = None


def world(group=None) -> tuple[int, int]:
    """(rank, number of ranks) of `group` (default: the whole job). Launched by `torchrun` / `accelerate launch`
    but not initialised yet: initialised through `accelerate.PartialState()`, as `Accelerator` / `Trainer` would.
    A plain `python` run is rank 0 of 1."""
    if not dist.is_available():
        return 0, 1
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return 0, 1
        try:
            from accelerate import PartialState
        except ImportError:
            raise InvalidConfigError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} but torch.distributed is not initialised; call "
                "torch.distributed.init_process_group() first (or install accelerate to have it done for you)"
            ) from None
        PartialState(cpu=_cpu_only())  # gloo on the CPU, as `accelerate launch --cpu` and Trainer(use_cpu) set it up
    return dist.get_rank(group), dist.get_world_size(group)


def _cpu_only() -> bool:
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    accelerator = getattr(torch, "accelerator", None)
    return not (accelerator.is_available() if accelerator is not None else torch.cuda.is_available())


def generate_batch(model, inputs: Sequence[Sequence[int]], generation_config=None, *, group=None,
                   **kwargs: Any) -> dict[str, RequestOutput]:
    """`model.generate_batch` over every rank: each rank generates its shard of `inputs` (prefix affinity, balanced
    by tokens: `plan_shards`), and every rank returns every output, in input order, named as `generate_batch`
    names them. Call it on every rank with the same `inputs`; in a single process it is `model.generate_batch`.

    Args:
        model: a model wrapped by `hf_paged.wrap` (each rank's own copy, or one tensor-parallel model).
        inputs: token-id lists, the same on every rank.
        generation_config, kwargs: as `model.generate_batch` takes them (`max_new_tokens=`, `sampling_params=`
            (one, or one per input), `priorities=`, `logits_processor=`, ...); per-input lists are sharded with
            the inputs.
        group: the process group to spread over (default: the whole job).

    Raises:
        InvalidConfigError: the model is not wrapped, or the ranks were given different inputs or generation
            settings (`sampling_params`, `generation_config`, `max_new_tokens`, `do_sample`, ...).
        UnsupportedModelError: the weights are sharded over the ranks by FSDP or DeepSpeed ZeRO-3 (every forward
            needs every rank, so the ranks cannot run different prompts).
        UnsupportedGenerationError: a tensor-parallel model over part of the group only (pass `group=` the
            data-parallel group).
        whatever `model.generate_batch` raises on any rank, on every rank.

    Example (`torchrun --nproc_per_node 2 eval.py`):
        >>> model = hf_paged.wrap(AutoModelForCausalLM.from_pretrained(path))            # doctest: +SKIP
        >>> outputs = hf_paged.distributed.generate_batch(model, prompts, max_new_tokens=64)  # doctest: +SKIP
    """
    return run_sharded(model, inputs, generation_config, group=group, **kwargs).outputs


def run_sharded(model, inputs: Sequence[Sequence[int]], generation_config=None, *, group=None,
                **kwargs: Any) -> DistributedRun:
    """`generate_batch`, with the plan, each rank's time and each rank's engine statistics."""
    rank, size = world(group)
    try:  # everything a rank can fail at before generating: the failure goes to every rank (`agreement`)
        if not is_wrapped(model):
            inner = getattr(model, "module", None)  # DistributedDataParallel
            hint = (f"pass the model {type(model).__name__} holds, wrapped: hf_paged.wrap(model.module)"
                    if isinstance(inner, torch.nn.Module) else "call hf_paged.wrap(model)")
            raise InvalidConfigError(f"model is not wrapped: {hint} on every rank first")
        tp_size = tensor_parallel_size(model)
        if tp_size > 1 and tp_size != size:
            raise UnsupportedGenerationError(
                f"the model is tensor parallel over {tp_size} ranks but the group has {size}: pass group= the "
                "data-parallel group (the ranks holding different copies of the model)"
            )
        if tp_size == 1:
            _check_not_sharded_weights(model)
        engine = engine_of(model)  # built here at the latest: a pool too big for one rank's memory fails on all
        # every argument checked on the whole list, as model.generate_batch checks it in one process (its errors,
        # the caller's indices), before any rank uses one: a rank that raised past here left the others waiting
        prompts = token_ids_of(engine, inputs)
        if kwargs.get("priorities") is not None:
            check_priorities(kwargs["priorities"], len(prompts))
        budgets = _output_budgets(model, prompts, generation_config, kwargs)
        plan = plan_shards(prompts, 1 if tp_size > 1 else size, block_size=engine.config.block_size,
                           max_new_tokens=budgets)
        if size > 1:
            settings = settings_digests(model, generation_config, kwargs) + wrap_settings(engine.config)
            if tp_size == 1:
                settings += weights_settings(model)
            plan_digest = hashlib.blake2b(repr((plan.rank_of, budgets)).encode(), digest_size=8).hexdigest()
            signature = CallSignature(len(prompts), inputs_digest(prompts), settings, plan_digest)
    except Exception as error:
        if size > 1:  # the others raise it after the exchange instead of waiting for this rank in it
            exchange(CallSignature(0, "", (), None, _picklable(error)), group, size)
        raise
    if size > 1:
        agree(exchange(signature, group, size), rank)
    mine = plan.indices(0 if tp_size > 1 else rank)
    local = _run_local(model, engine, prompts, mine, generation_config, rank, kwargs)
    own = local.outputs or []
    if tp_size > 1:
        local.outputs = None  # every rank computed every request: nothing to send
    results = [local]
    if size > 1:
        results = [None] * size  # type: ignore[list-item]
        dist.all_gather_object(results, local, group=group)
    if local.error is not None:
        raise local.error  # (the object itself, with its traceback; the gathered copies have none)
    raise_any_error(results, rank)
    outputs = own if tp_size > 1 else _in_input_order(results, len(prompts))
    return DistributedRun({o.request_id: o for o in outputs}, plan, tuple(r.seconds for r in results),
                          tuple(r.engine_stats for r in results))


def _run_local(model, engine, prompts, mine: list[int], generation_config, rank: int,
               kwargs: dict) -> _RankResult:
    """This rank's shard through `model.generate_batch`, outputs renamed to the inputs' own indices."""
    shard_kwargs = dict(kwargs)
    for name in ("sampling_params", "priorities"):  # per-input lists follow their inputs
        value = kwargs.get(name)
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            shard_kwargs[name] = [value[i] for i in mine]
    if rank != 0:
        shard_kwargs.pop("progress_bar", None)
    start = time.perf_counter()
    try:
        shard = model.generate_batch([prompts[i] for i in mine], generation_config, **shard_kwargs) if mine else {}
    except Exception as error:  # noqa: BLE001 -- every rank must reach the gather; each re-raises it there
        return _RankResult([], time.perf_counter() - start, {}, _picklable(error))
    seconds = time.perf_counter() - start
    renamed = []
    for name, output in shard.items():
        parent = fork_parent(name)
        output.request_id = f"req_{mine[int(parent[len('req_'):])]}{name[len(parent):]}"
        renamed.append(output)
    return _RankResult(renamed, seconds, dict(engine.stats()))


def _in_input_order(results: list[_RankResult], num_inputs: int) -> list[RequestOutput]:
    by_input: list[list[RequestOutput]] = [[] for _ in range(num_inputs)]
    for result in results:
        for output in result.outputs or ():
            by_input[int(fork_parent(output.request_id)[len("req_"):])].append(output)  # parent, then its forks
    return [o for outputs in by_input for o in outputs]


def _output_budgets(model, prompts, generation_config, kwargs) -> list[int]:
    """Each input's max_new_tokens as `generate_batch` will see it (only the balance depends on it); a
    `sampling_params` or `max_new_tokens` that `generate_batch` refuses raises its error here."""
    params = kwargs.get("sampling_params")
    if params is not None:  # (the other options beside it are refused by each shard's call: the same on every rank)
        each = per_input_params(params, len(prompts))
        return [p.max_new_tokens * p.num_return_sequences for p in each]
    budget = kwargs.get("max_new_tokens")
    if budget is not None:
        return [SamplingParams(max_new_tokens=budget).max_new_tokens] * len(prompts)  # (its error for a bad one)
    config = generation_config if generation_config is not None else model.generation_config
    budget = getattr(config, "max_new_tokens", None)
    return [budget if isinstance(budget, int) and budget > 0 else 0] * len(prompts)


def _check_not_sharded_weights(model) -> None:
    """FSDP (1 and 2) and ZeRO-3 gather each layer's weights from every rank in every forward: ranks running
    different prompts would run different numbers of forwards and wait on each other for ever."""
    from torch.distributed.tensor import DTensor

    for module in model.modules():
        name = type(module).__name__
        if name == "FullyShardedDataParallel" or any(t.__name__ == "FSDPModule" for t in type(module).__mro__):
            break
    else:
        param = next(model.parameters(), None)
        if param is None or not (isinstance(param, DTensor) or hasattr(param, "ds_id")):
            return
    raise UnsupportedModelError(
        f"{type(model).__name__}'s weights are sharded over the ranks (FSDP or DeepSpeed ZeRO-3): every forward "
        "needs every rank, so the ranks cannot generate different prompts; gather the full weights on each rank "
        "for generation (e.g. a copy loaded with from_pretrained on each rank)"
    )


def _picklable(error: Exception) -> Exception:
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 -- any pickling failure: send its words instead
        return RuntimeError(f"{type(error).__name__}: {error}")
