"""Ctrl-C between engine steps, never inside one.

Python raises `KeyboardInterrupt` in the main thread at whatever bytecode that thread runs when SIGINT arrives (a
function's entry, the return of a C call). When the main thread drives the engine loop (a synchronous `generate`
drives its own steps, `EngineLoop.follow`), that could be the middle of a step: blocks taken from the pool and not
yet in a block table, a request whose tokens were computed but not sampled, a step listener that had popped another
caller's output and not handed it over. The interrupted caller aborts its own requests, but the rest stayed broken:
another thread's request never ended (its caller waited for ever) and the next call spun in the scheduler on the
half-stepped request. A `with` on a lock written in Python (`threading.Condition`) can even leak the lock: the
interrupt arrives at the entry of its `__exit__`.

So the functions that change the loop's or the engine's state are marked `@critical`. While the main thread runs
inside one (its frame is on the stack: no counter that an interrupt could leave wrong), our SIGINT handler notes the
signal instead of raising; the outermost critical call raises it when it returns, the state whole again (a step
takes milliseconds, up to a long prefill chunk; a second Ctrl-C meanwhile goes through). Anywhere else (waiting for the loop thread, a streamer's `put`,
user code between steps) the signal goes at once to the handler we replaced (Python's `default_int_handler`,
asyncio's, a notebook kernel's), as without us. Only the main thread receives signals; in other threads `critical`
costs one check.

Our handler is installed for the span of a call (`installed`; setting a handler is a system call, so a synchronous
call installs it once, not at every step) and only where SIGINT has a Python handler (none: no `KeyboardInterrupt`
can come from it). If an interrupt cuts the installing or restoring itself, ours may stay installed: it then passes
every signal on outside critical code, which is what the replaced handler did.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, TypeVar

__all__ = ["critical", "installed"]

_F = TypeVar("_F", bound=Callable[..., Any])
_CRITICAL: set[CodeType] = set()  # the code of every @critical function


def _inside_critical(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _CRITICAL:
            return True
        frame = frame.f_back
    return False


try:  # the C function under `signal.getsignal` (which converts to enums in Python: 5 us a turn)
    from _signal import getsignal as _getsignal
except ImportError:  # (another Python implementation)
    _getsignal = signal.getsignal

_main_ident = threading.main_thread().ident  # (a forked child's main thread is the forking one: `_after_fork`)


def _in_main_thread() -> bool:
    return threading.get_ident() == _main_ident


class _Guard:
    """The SIGINT handler's state (main thread only)."""

    __slots__ = ("pending", "previous")

    def __init__(self) -> None:
        self.pending: tuple[int, FrameType | None] | None = None  # a SIGINT that arrived inside critical code
        self.previous: Callable[[int, FrameType | None], Any] | None = None  # the handler ours replaced

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Our SIGINT handler (it runs in the main thread, between two bytecodes of `frame`). A second Ctrl-C while
        one is held goes through at once: the step may be stuck (a logits processor of the user's that never
        returns), and a user pressing again wants out more than a whole pool."""
        if _inside_critical(frame) and self.pending is None:
            self.pending = (signum, frame)
        else:
            self.pending = None
            self.forward(signum, frame)

    def forward(self, signum: int, frame: FrameType | None) -> None:
        previous = self.previous
        if callable(previous) and previous != self.handle:
            previous(signum, frame)
        else:
            signal.default_int_handler(signum, frame)

    def deliver(self, frame: FrameType | None) -> None:
        """Hand a noted signal on, unless `frame` (the caller's) is still inside critical code."""
        if self.pending is not None and not _inside_critical(frame):
            pending, self.pending = self.pending, None
            self.forward(*pending)


_GUARD = _Guard()


class installed:
    """Our SIGINT handler for the span of a call in the main thread (a no-op elsewhere, when it is already
    installed, or when SIGINT has no Python handler); the replaced one is put back at the end."""

    __slots__ = ("_mine",)

    def __enter__(self) -> None:
        self._mine = False
        if not _in_main_thread():
            return
        current = _getsignal(signal.SIGINT)
        if not callable(current) or current == _GUARD.handle:
            return
        _GUARD.previous, _GUARD.pending = current, None
        try:
            signal.signal(signal.SIGINT, _GUARD.handle)
        except ValueError:  # (not the main interpreter)
            return
        self._mine = True

    def __exit__(self, *exc: object) -> None:
        if self._mine and _getsignal(signal.SIGINT) == _GUARD.handle:
            signal.signal(signal.SIGINT, _GUARD.previous)


def critical(fn: _F) -> _F:
    """Mark `fn` as changing shared state: in the main thread, a SIGINT that arrives while it runs is raised when
    the outermost critical call returns."""
    _CRITICAL.add(fn.__code__)

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not _in_main_thread():
            return fn(*args, **kwargs)
        install = installed()
        install.__enter__()
        try:
            return fn(*args, **kwargs)
        finally:
            install.__exit__()
            _GUARD.deliver(sys._getframe().f_back)  # (unless the caller is inside critical code too)

    _CRITICAL.add(guarded.__code__)  # (cut before it calls `fn`, `fn` would not run: a lock never released)
    return guarded  # type: ignore[return-value]


def _after_fork() -> None:
    """A child forked inside a call (a callback starting a process) never ends that call: the handler back."""
    global _main_ident
    _main_ident = threading.main_thread().ident
    if _getsignal(signal.SIGINT) == _GUARD.handle and callable(_GUARD.previous):
        try:
            signal.signal(signal.SIGINT, _GUARD.previous)
        except ValueError:
            pass
    _GUARD.pending = None


os.register_at_fork(after_in_child=_after_fork)
