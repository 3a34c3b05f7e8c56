"""When and how the engine's attention runs the CPU kernels (`cpu_attention`), once per forward for every layer.

    plan_cpu_attention(tables, ...)              host arrays of the step (built once, shared by the layers)
    run_cpu_attention(plan, q, k, v, ...)        kernel for the short chunks and decodes, torch for long prefills

A sequence whose chunk has at most `MAX_KERNEL_QUERIES` queries (decodes, short extends) is attended by the
kernel in place, unless (plain blocks) its queries times its context pass `MAX_KERNEL_PAIRS` (never a decode: one
query has no gather to share); a longer prefill chunk, or a short one after a long cached context, goes to the torch
plan (`reference.build_attention_plan`), where one matmul over the chunk amortises the gather of its context.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hf_paged.cache.kernels.quantized import QuantizedKV
from hf_paged.cache.kernels.reference import AttentionPlan, build_attention_plan, run_attention_plan

__all__ = [
    "CpuAttentionPlan",
    "CpuLaunch",
    "cpu_kernel_applies",
    "kernel_launch",
    "parallel_layer_ok",
    "plan_cpu_attention",
    "quantized_args",
    "run_cpu_attention",
]


def cpu_kernel_applies(query: torch.Tensor, *caches) -> bool:
    """fp32 tensors on the CPU (numba has no half-precision arithmetic there)."""
    if query.device.type != "cpu" or query.dtype != torch.float32:
        return False
    return all(c.data.device.type == "cpu" if isinstance(c, QuantizedKV) else c.dtype == torch.float32
               for c in caches)


@dataclass(slots=True)
class CpuAttentionPlan:
    """The step's metadata as the kernels take it, plus the torch plan of the long prefill chunks (if any)."""

    tables: np.ndarray  # [num_seqs, max_blocks] int32
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    context_lens: np.ndarray  # [num_seqs] int32
    seqs: np.ndarray  # int32 sequences the kernel attends
    window: int  # 0 = none
    long_seqs: list[int]  # the sequences of longer chunks, attended on the torch path
    long: AttentionPlan | None  # their torch plan over a plain cache (None for a quantized one: see `run`)



def plan_cpu_attention(block_tables: torch.Tensor, query_start_loc: list[int], context_lens: list[int],
                       block_size: int, sliding_window: int | None, *, quantized: bool = False) -> CpuAttentionPlan:
    """The plan of one forward (shared by its layers): which sequences the kernel attends, the rest's torch plan."""
    from hf_paged.cache.kernels.cpu_attention import MAX_KERNEL_PAIRS, MAX_KERNEL_QUERIES

    qsl = np.asarray(query_start_loc, dtype=np.int32)
    tables, lens = block_tables.cpu().to(torch.int32).numpy(), np.asarray(context_lens, dtype=np.int32)
    if query_start_loc == list(range(len(query_start_loc))):  # one query per sequence (all decodes)
        return CpuAttentionPlan(tables, qsl, lens, np.arange(len(context_lens), dtype=np.int32), sliding_window or 0,
                                [], None)
    q_lens = np.diff(qsl)
    short = q_lens <= MAX_KERNEL_QUERIES
    if not quantized:  # (quantized chunks keep the query rule: their other path dequantizes the whole context)
        keys = lens if not sliding_window else np.minimum(lens, sliding_window + q_lens)
        short &= (q_lens <= 1) | (q_lens * keys <= MAX_KERNEL_PAIRS)
    long_seqs = np.flatnonzero(~short).tolist()
    long = None
    if long_seqs and not quantized:
        long = build_attention_plan(block_tables.cpu(), query_start_loc, context_lens, block_size, sliding_window,
                                    skip=short.tolist(), in_place=True)
    return CpuAttentionPlan(tables, qsl, lens, np.flatnonzero(short & (q_lens > 0)).astype(np.int32),
                            sliding_window or 0, long_seqs, long)


def run_cpu_attention(plan: CpuAttentionPlan, query: torch.Tensor, key_cache, value_cache, *, scale: float,
                      softcap: float | None, tail=None) -> torch.Tensor:
    """query [T, H, D] fp32 -> [T, H, D]: plain caches, or `QuantizedKV` with their `FullPrecisionTail`."""
    q = query.contiguous()
    out = torch.empty_like(q)
    if plan.seqs.size:
        kernel_launch(plan, q, key_cache, value_cache, scale=scale, softcap=softcap, tail=tail, out=out,
                      parallel=plan.seqs.size > 1 and _threads()).run()
    if plan.long is not None:
        run_attention_plan(plan.long, q, key_cache, value_cache, scale=scale, softcap=softcap, out=out)
    elif plan.long_seqs:  # quantized: each long chunk dequantizes its own context (one matmul amortises it)
        from hf_paged.cache.kernels.cpu_prefill import prefill_quantized_segments

        prefill_quantized_segments(q, key_cache, value_cache, torch.from_numpy(plan.tables),
                                   plan.query_start_loc.tolist(), plan.context_lens.tolist(), plan.long_seqs,
                                   scale=scale, sliding_window=plan.window or None, tail=tail, out=out)
    return out


@dataclass(slots=True, frozen=True)
class CpuLaunch:
    """One call of a compiled kernel, fully decided (`cpu_warm` probes numba's cache with it before running)."""

    kernel: Any  # a numba dispatcher
    args: tuple[Any, ...]

    def run(self) -> None:
        self.kernel(*self.args)


def kernel_launch(plan: CpuAttentionPlan, q: torch.Tensor, key_cache, value_cache, *, scale: float,
                  softcap: float | None, tail, out: torch.Tensor, parallel: bool) -> CpuLaunch:
    """The kernel call for the plan's short sequences: plain caches, or (with a `tail`) quantized ones; `parallel`:
    sequences spread over numba's threads."""
    from hf_paged.cache.kernels import cpu_attention as ck

    common = (plan.tables, plan.query_start_loc, plan.context_lens, plan.seqs, np.float32(scale), plan.window,
              np.float32(softcap or 0.0), out.numpy())
    if tail is None:
        kernel = ck.attend_plain_parallel if parallel else ck.attend_plain
        return CpuLaunch(kernel, (q.numpy(), key_cache.numpy(), value_cache.numpy(), *common))
    from hf_paged.cache.kernels import cpu_quantized as cq

    kernel = cq.attend_quantized_parallel if parallel else cq.attend_quantized
    k_args, v_args = quantized_args(key_cache), quantized_args(value_cache)
    return CpuLaunch(kernel, (q.numpy(), *k_args[:5], *v_args[:5], k_args[5] or v_args[5], tail.key.numpy(),
                              tail.value.numpy(), tail.block_tables.numpy(), *common))


_DUMMY_ZERO = np.zeros((1, 1, 1), np.int8)
_parallel_ok: bool | None = None  # None: not tried yet


def parallel_layer_ok() -> bool:
    """Whether numba has a thread-safe threading layer here (TBB or OpenMP; its `workqueue` layer aborts the
    process when two threads launch at once, so it is never used); loaded once per process."""
    global _parallel_ok
    if _parallel_ok is None:
        import numba

        if os.environ.get("NUMBA_THREADING_LAYER") is None:
            numba.config.THREADING_LAYER = "threadsafe"
        torch_threads = torch.get_num_threads()
        try:
            from hf_paged.cache.kernels.cpu_attention import attend_plain_parallel  # noqa: F401

            numba.set_num_threads(1)  # loads the threading layer (raises if none is thread-safe)
            _parallel_ok = numba.threading_layer() in ("tbb", "omp")
        except (ValueError, RuntimeError):
            _parallel_ok = False
        finally:  # numba's OpenMP layer starts the OpenMP runtime torch shares: its thread count is reset there
            torch.set_num_threads(torch_threads)
    return _parallel_ok


def _after_fork_in_child() -> None:
    """GNU OpenMP terminates a forked child at its first parallel region once the parent used it ("fork() called
    from a process already using GNU OpenMP, this is unsafe"): a child of a process that ran numba's `omp` layer
    (a multiprocessing pool's worker with several torch threads, a kernel load restarted there) runs the serial
    kernels."""
    global _parallel_ok
    if _parallel_ok:
        import numba

        _parallel_ok = numba.threading_layer() != "omp"


os.register_at_fork(after_in_child=_after_fork_in_child)


def _threads() -> bool:
    """Whether to spread sequences over threads: torch is given several, and numba has a thread-safe threading
    layer. numba runs as many threads as torch does."""
    wanted = torch.get_num_threads()
    if wanted <= 1 or not parallel_layer_ok():
        return False
    import numba

    threads = min(wanted, numba.config.NUMBA_NUM_THREADS)
    if numba.get_num_threads() != threads:
        numba.set_num_threads(threads)
    return True


def quantized_args(cache) -> tuple:
    """(data, scale, zero, format code, scale layout, log_scale) of a plain tensor or `QuantizedKV`."""
    from hf_paged.cache.kernels import cpu_quantized as ck

    if isinstance(cache, torch.Tensor):
        return cache.numpy(), _DUMMY_ZERO, _DUMMY_ZERO, ck.PLAIN, ck.PER_TOKEN, False
    log = cache.scale.dtype == torch.uint8
    scale = cache.scale if log else cache.scale.view(torch.int16)
    layout = ck.PER_CHANNEL if cache.per_channel else ck.PER_HEAD if cache.per_head else ck.PER_TOKEN
    if layout == ck.PER_TOKEN:
        scale = scale.unsqueeze(-1)
    zero = _DUMMY_ZERO if cache.zero is None else (cache.zero.unsqueeze(-1) if layout == ck.PER_TOKEN
                                                   else cache.zero).numpy()
    data = cache.data.view(torch.uint8) if cache.format == "fp8" else cache.data
    code = {"int8": ck.INT8, "fp8": ck.FP8, "int4": ck.INT4}[cache.format]
    return data.numpy(), scale.numpy(), zero, code, layout, log
