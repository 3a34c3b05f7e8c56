"""The CPU attention kernels made ready off the caller's clock (issue 36, point 1).

A cache on the CPU in fp32 asks for the compiled variants its layers will call (`prepare`): the plain kernel, or
the fused-dequant kernel of its (key, value) block formats, each serial and, where numba has a thread-safe
threading layer, parallel. A background thread then

    numba's on-disk cache holds each call's signature?  load them (a fraction of a second, off the caller's path)
    otherwise (a fresh install, a new format)           a child process compiles them (`background_compile`: one
                                                        per cache at a time, lowered priority); then load

and marks the variant ready. Until then attention takes the torch path: every step's metadata snapshots the ready
variants when it is built (`ready_variants`), so the switch happens between steps, never inside one.
`HF_PAGED_JIT=off`: never ready (torch path); `HF_PAGED_JIT=now`: `prepare` waits until ready (benchmarks).
"""

from __future__ import annotations

import ast
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from hf_paged.background_compile import Outcome, compile_in_child
from hf_paged.cache.compression.formats import BlockFormat, formats_for
from hf_paged.cache.kernels.cpu_launch import CpuLaunch, kernel_launch, parallel_layer_ok, plan_cpu_attention
from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV
from hf_paged.compat import numba_cache_index

__all__ = ["PLAIN", "KernelVariant", "compile_here", "in_cache", "prepare", "ready_variants", "variant_for",
           "variant_of", "wait", "warm_launches"]

logger = logging.getLogger(__name__)

FormatKey = tuple[str, bool, bool, bool]  # BlockFormat (name, per_channel, per_head, log_scale)


@dataclass(slots=True, frozen=True)
class KernelVariant:
    """The compiled kernels one kind of layer calls: the plain kernel (`formats` None) or the fused-dequant kernel
    for (key, value) block formats (a side may be "auto": full precision read through the same kernel)."""

    formats: tuple[FormatKey, FormatKey] | None = None


PLAIN = KernelVariant()
_ready: set[KernelVariant] = set()
_ready_snapshot: frozenset[KernelVariant] = frozenset()
_started: dict[KernelVariant, threading.Event] = {}  # set once the variant is ready or will never be
_pending_after_fork: list[KernelVariant] = []  # loading when this process was forked: started again at a step
_lock = threading.Lock()


def _key(fmt: BlockFormat) -> FormatKey:
    return (fmt.name, fmt.per_channel, fmt.per_head, fmt.log_scale)


def variant_of(key_format: BlockFormat, value_format: BlockFormat) -> KernelVariant:
    """The variant a compressed layer of these formats calls."""
    return KernelVariant((_key(key_format), _key(value_format)))


def ready_variants() -> frozenset[KernelVariant]:
    """The variants loaded now (a step's metadata keeps this snapshot for all its layers). In a child forked while
    some were loading, the first call starts their loading here (`_after_fork_in_child`)."""
    global _pending_after_fork
    if _pending_after_fork:
        pending, _pending_after_fork = _pending_after_fork, []
        prepare(pending)
    return _ready_snapshot


def prepare(variants: Iterable[KernelVariant]) -> None:
    """Make the variants ready in a background thread (idempotent; returns at once unless `HF_PAGED_JIT=now`)."""
    variants = list(variants)
    mode = os.environ.get("HF_PAGED_JIT", "background")
    if mode == "off":
        return
    try:
        _import_kernels()
    except Exception as exc:  # noqa: BLE001 -- no numba or no compiler here: the torch path serves
        logger.warning("hf_paged: the CPU attention kernels are unavailable (%s: %s); attention runs on torch",
                       type(exc).__name__, exc)
        return
    with _lock:
        new = [v for v in dict.fromkeys(variants) if v not in _started]
        for v in new:
            _started[v] = threading.Event()
    if new:
        threading.Thread(target=_load, args=(new,), name="hf_paged-cpu-kernels", daemon=True).start()
    if mode == "now":
        wait(variants)


def variant_for(config) -> KernelVariant:
    """The variant an engine of this `PagedConfig` will call (the cache's own formats decide; see `PagedCache`)."""
    key, value = formats_for(config.key_dtype, config.value_dtype, config.value_quant_group, config.kv_scale_format)
    return variant_of(key, value) if key.is_quantized or value.is_quantized else PLAIN


def _import_kernels() -> None:
    """numba and the kernel modules, imported on the caller's thread (~0.4 s, once per process) when a CPU cache
    or a wrap asks for kernels: an import holds the GIL throughout, so in a background loader it would stall the
    request running meanwhile by as long (measured: one forward of the embedded model waited 388 ms)."""
    from hf_paged.cache.kernels import cpu_attention, cpu_quantized  # noqa: F401

    parallel_layer_ok()


def wait(variants: Iterable[KernelVariant], timeout: float | None = None) -> bool:
    """Block until the variants are ready (True), or `timeout` seconds pass or they never will be (False)."""
    variants = list(variants)
    for v in variants:
        event = _started.get(v)
        if event is None or not event.wait(timeout):
            return False
    return all(v in _ready for v in variants)


def warm_launches(variant: KernelVariant, parallel: bool) -> list[CpuLaunch]:
    """Calls on tiny inputs built as the layers build theirs (so their numba signatures are the ones a step
    uses): two sequences of one query each; serial, and parallel too when `parallel`."""
    q = torch.zeros(2, 2, 4)
    tables = torch.tensor([[0], [1]], dtype=torch.int32)
    plan = plan_cpu_attention(tables, [0, 1, 2], [1, 2], 2, None, quantized=variant.formats is not None)
    if variant.formats is None:
        key = value = torch.zeros(2, 2, 1, 4)
        tail = None
    else:
        key, value = (_operand(BlockFormat(name, per_channel=pc, per_head=ph, log_scale=log))
                      for name, pc, ph, log in variant.formats)
        tail = FullPrecisionTail(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4), tables)
    return [kernel_launch(plan, q, key, value, scale=1.0, softcap=None, tail=tail, out=torch.empty_like(q),
                          parallel=p) for p in ((False, True) if parallel else (False,))]


def _operand(fmt: BlockFormat):
    """A two-block cache of `fmt` as a compressed layer hands it to the kernels (`CompressedKV.kernel_operand`)."""
    parts = {name: t.zero_() for name, t in fmt.allocate(2, 2, 1, 4, torch.float32, "cpu").items()}
    if not fmt.is_quantized:
        return parts["data"]
    return QuantizedKV(parts["data"], parts["scale"], fmt.name, parts.get("zero"), fmt.per_channel, fmt.per_head)


def in_cache(launch: CpuLaunch) -> bool:
    """Whether the call's signature is compiled in this process or in numba's on-disk cache (numba's internals:
    any surprise reads as "not cached", which costs only a child process)."""
    dispatcher = launch.kernel
    try:
        signature = tuple(dispatcher.typeof_pyval(a) for a in launch.args)
        if signature in dispatcher.overloads:
            return True
        wanted = (signature, dispatcher.targetctx.codegen().magic_tuple())
        # (numba 0.68 keys an entry (signature, magic tuple, code hashes): an exact 2-tuple test never matched, and
        # every process started a compiling child to find everything cached)
        return any(key[:2] == wanted for key in numba_cache_index(dispatcher))
    except Exception:  # noqa: BLE001 -- internal API: be conservative
        return False


def compile_here(encoded: str) -> None:
    """The child process: compile (and cache) every call of the variants (`repr` of their format tuples)."""
    parallel = parallel_layer_ok()
    for formats in ast.literal_eval(encoded):
        for launch in warm_launches(KernelVariant(formats), parallel):
            launch.run()


def _load(variants: list[KernelVariant]) -> None:
    """The loader thread. Its warm-up tensors are freed (in `_compile_and_load`'s frame) before a waiter is woken: a
    daemon thread freeing a torch tensor releases the GIL, and one that then finds the interpreter finalizing (the
    waiter's script returned) exits through torch's C++ frames, which aborts the process ("terminate called without
    an active exception", seen at exit after a first compile)."""
    global _ready_snapshot
    try:
        _compile_and_load(variants)
        with _lock:
            _ready.update(variants)
            _ready_snapshot = frozenset(_ready)
    except Exception as exc:  # noqa: BLE001 -- no numba, no compiler: the torch path stays
        logger.warning("hf_paged: the CPU attention kernels are unavailable (%s: %s); attention runs on torch",
                       type(exc).__name__, exc)
    finally:
        for v in variants:
            _started[v].set()


def _compile_and_load(variants: list[KernelVariant]) -> None:
    """Load the variants' calls from numba's cache, compiling them in a child process first where they are missing."""
    parallel = parallel_layer_ok()
    launches = [launch for v in variants for launch in warm_launches(v, parallel)]
    encoded = repr([v.formats for v in variants])
    done = compile_in_child(f"from hf_paged.cache.kernels import cpu_warm; cpu_warm.compile_here({encoded!r})",
                            lambda: all(in_cache(launch) for launch in launches))
    if done.outcome is Outcome.FAILED:  # (then the calls below compile here, in this thread)
        logger.info("hf_paged: compiling the CPU attention kernels in a child process failed (%s)", done.detail)
    for launch in launches:
        launch.run()


def _after_fork_in_child() -> None:
    """A child forked while the loader thread worked (or held `_lock`): that thread does not exist here, so its lock
    is fresh, and a variant it was loading starts again at the next `prepare` or at the child's first step
    (`ready_variants`: an engine forked with its process would otherwise stay on the torch path for good; its event
    would never be set: `HF_PAGED_JIT=now` waited for ever). Every event is new too (its own lock may have been
    held mid-`set`)."""
    global _lock, _started, _pending_after_fork
    _lock = threading.Lock()
    _pending_after_fork = [v for v, e in _started.items() if not e.is_set()]  # (an engine forked with its steps)
    _started = {v: _set_event() for v, e in _started.items() if e.is_set()}


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


os.register_at_fork(after_in_child=_after_fork_in_child)
