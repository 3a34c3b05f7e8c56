"""Compiled loops (numba) without compiling on the user's clock.

A kernel is a plain Python function written for numba (loops over numpy arrays). `@kernel` wraps it in a
`Kernel` that runs the Python body until the compiled one is ready, then the compiled one: the same code, the
same results, only the speed changes. Nothing compiles on a caller's thread:

    start() (a vocabulary of 4096+ tokens, an NFA of 5000+ positions)  ->  a background thread:
        numba's on-disk cache holds every kernel?   load them (~0.7 s of CPU, off the caller's path)
        otherwise (a fresh install)                 a child process compiles them (its own interpreter and
                                                    core, lowered priority) and writes the cache; then load
                                                    (one child per cache at a time: `background_compile`)
        every warm-up call (the exact signatures the callers use) passes -> all kernels switch at once

`HF_PAGED_JIT=off` keeps the Python bodies (no numba at all); `HF_PAGED_JIT=now` makes `start()` wait until the
kernels are compiled (benchmarks that time the compiled code from their first call). `wait()` blocks until the
switch (tests and benchmarks).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.background_compile import Outcome, compile_in_child, lock_path, sources_digest
from hf_paged.compat import numba_cache_index, seal_numba_cache

__all__ = ["Kernel", "helper", "is_compiled", "kernel", "start", "wait", "warm_up"]

logger = logging.getLogger(__name__)

# the modules that define kernels (the child imports them all; none of them imports torch)
KERNEL_MODULES = (
    "hf_paged.processors.index.walk_kernel",
    "hf_paged.processors.index.closed_states",
    "hf_paged.processors.index.mask_kernel",
    "hf_paged.processors.automaton.dfa_kernel",
    "hf_paged.processors.automaton.refine_kernel",
    "hf_paged.processors.automaton.layout_kernel",
    "hf_paged.processors.automaton.nfa_kernel",
    "hf_paged.processors.automaton.utf8",
)
# what they compile from, helpers in other modules included: their on-disk cache is keyed on all of it
KERNEL_SOURCES = ("processors/automaton", "processors/index", "processors/jit.py")
_KERNELS: list[Kernel] = []
_HELPERS: list[Callable[..., Any]] = []  # functions compiled kernels call (never run as Python: see `helper`)
_WARM_UPS: list[Callable[[], None]] = []  # one call per kernel in the signatures its callers use
_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)
_DONE = threading.Event()  # set once the kernels switched (or will never switch: off, or a failure)
_thread: threading.Thread | None = None
_restart = False  # a forked child whose parent was loading: the next kernel call starts a loader here


def _after_fork_in_child() -> None:
    """A child forked while the loader worked (a DataLoader or pool worker forked right after a processor was
    built): that thread does not exist here, so the kernels would stay Python bodies for the child's life and
    `wait` would never see them. The child's next kernel call starts a loader of its own (a child that never calls
    one starts nothing); a finished loading carries over. The event is new either way (its own lock may have been
    held mid-`set`)."""
    global _DONE, _thread, _restart
    done = _DONE.is_set()
    _DONE = threading.Event()
    if done:
        _DONE.set()
    elif _thread is not None:
        _thread, _restart = None, True


os.register_at_fork(after_in_child=_after_fork_in_child)


class Kernel:
    """A numba-ready Python function: runs as Python until the compiled version is loaded (`start`)."""

    __slots__ = ("__name__", "compiled", "dispatcher", "misses", "python", "source")

    def __init__(self, source: Callable[..., Any], python: Callable[..., Any] | None = None):
        self.source = source  # what numba compiles
        self.python = python or source  # what runs until then (the source itself, or a numpy twin)
        self.__name__ = source.__name__
        self.dispatcher: Any = None  # numba's dispatcher (warm-ups call it), made by the loader thread
        self.compiled: Any = None  # the dispatcher once every kernel is loaded
        self.misses = 0  # calls in a signature no warm-up compiled (they ran as Python: a warm-up to add)

    def __call__(self, *args: Any) -> Any:
        compiled = self.compiled
        if compiled is None:
            if _restart:
                start()
            return self.python(*args)
        try:
            return compiled(*args)
        except TypeError:  # a signature no warm-up compiled (compiling is disabled after the switch): Python
            self.misses += 1
            if self.misses == 1:
                logger.warning("hf_paged: kernel %s called in a signature no warm-up compiled; it runs as Python",
                               self.__name__)
            return self.python(*args)


def kernel(function: Callable[..., Any] | None = None, *, python: Callable[..., Any] | None = None) -> Any:
    """Register a numba-ready function as a kernel (it must not call other kernels: compile one loop each).
    `python`: a faster twin for the uncompiled phase (numpy, same results), where the plain loops would be slow."""

    def wrap(source: Callable[..., Any]) -> Kernel:
        wrapped = Kernel(source, python)
        _KERNELS.append(wrapped)
        return wrapped

    return wrap(function) if function is not None else wrap


def helper(function: Callable[..., Any]) -> Callable[..., Any]:
    """Register a function that compiled kernels call: the loader compiles it and puts the compiled version in its
    module's namespace before the kernels compile. Only kernels with a Python twin (`kernel(python=...)`) may call
    helpers: their own bodies never run as Python, so nothing runs a helper uncompiled by surprise."""
    _HELPERS.append(function)
    return function


def warm_up(function: Callable[[], None]) -> Callable[[], None]:
    """Register a function that calls kernels' `dispatcher`s once each, with tiny arguments of the exact types,
    ranks and layouts the callers pass (compiled in the child, loaded from the cache by the loader thread)."""
    _WARM_UPS.append(function)
    return function


def is_compiled() -> bool:
    """Whether the kernels run compiled now."""
    return bool(_KERNELS) and all(k.compiled is not None for k in _KERNELS)


def start() -> None:
    """Load (or, in a child process, compile) the kernels in the background; idempotent, returns at once (waits
    for the switch when `HF_PAGED_JIT=now`)."""
    global _thread, _restart
    _restart = False
    mode = os.environ.get("HF_PAGED_JIT", "background")
    if mode == "child":  # (the compiling child: `compile_here` does the work)
        return
    if mode == "off":
        _DONE.set()
        return
    with _LOCK:
        if _thread is None:
            _thread = threading.Thread(target=_load_all, name="hf_paged-jit", daemon=True)
            _thread.start()
    if mode == "now":
        _DONE.wait()


def wait(timeout: float | None = None) -> bool:
    """Start if needed and block until the kernels switched (True) or `timeout` seconds passed (False)."""
    start()
    return _DONE.wait(timeout) and is_compiled()


def compile_here() -> None:
    """The child process: compile every kernel in the callers' signatures and write numba's cache, then the mark
    that the cache is whole (`_complete`)."""
    _dispatchers()
    for call in _WARM_UPS:
        call()
    _complete_mark().touch()


def _dispatchers() -> None:
    from numba import njit

    for name in KERNEL_MODULES:
        importlib.import_module(name)
    for function in _HELPERS:
        module = sys.modules[function.__module__]
        if getattr(module, function.__name__) is function:
            setattr(module, function.__name__, njit(cache=True, nogil=True)(function))
    for k in _KERNELS:
        if k.dispatcher is None:
            k.dispatcher = njit(cache=True, nogil=True)(k.source)
    seal_numba_cache([k.dispatcher for k in _KERNELS], sources_digest(*KERNEL_SOURCES))  # helpers' files too


def _complete_mark():
    """The file a compiling child writes once every warm-up has compiled (beside the compile lock, named after the
    kernels' sources). A child that ended before (its parent exited, its grace ran out) leaves kernels cached in
    some of their signatures only: without the mark, the loader would find an entry for each and compile the
    missing signatures on its own thread."""
    return lock_path().parent / f"hf_paged-jit-{sources_digest(*KERNEL_SOURCES)}.complete"


def _complete() -> bool:
    return _complete_mark().exists() and all(_cached(k.dispatcher) for k in _KERNELS)


def _cached(dispatcher: Any) -> bool:
    """Whether numba's on-disk cache has an entry for this function (its index; numba's internals, so any
    surprise reads as "not cached", which only costs a child process)."""
    return bool(numba_cache_index(dispatcher))


def _load_all() -> None:
    try:
        _dispatchers()
        done = compile_in_child("from hf_paged.processors import jit; jit.compile_here()",
                                _complete, {"HF_PAGED_JIT": "child"})
        if done.outcome is Outcome.FAILED:  # (then the warm-ups below compile here, in this thread)
            logger.info("hf_paged: compiling the kernels in a child process failed (%s); compiling in a "
                        "background thread", done.detail)
        for call in _WARM_UPS:
            call()
        for k in _KERNELS:
            k.dispatcher.disable_compile()  # a new signature must never compile on a caller's thread
        for k in _KERNELS:
            k.compiled = k.dispatcher
    except Exception as exc:  # noqa: BLE001 -- no numba, no compiler, no cache: the Python bodies stay
        logger.warning("hf_paged: the compiled kernels are unavailable (%s: %s); using their Python versions",
                       type(exc).__name__, exc)
    finally:
        _DONE.set()
