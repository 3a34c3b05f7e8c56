"""Engine loops across `os.fork` (gunicorn --preload, multiprocessing's fork start method, DataLoader workers).

    parent, before the fork   each loop's engine lock taken by the forking thread: a step another thread runs
                              ends first (up to `FORK_WAIT_S`), so the child's copy is between two steps
    parent, after             the locks released
    child, after              fresh loop locks and no loop thread (one starts at the next submission); the requests
                              in flight and the queued submissions belong to the parent's callers, who wait in the
                              parent: dropped without a word, their blocks back to the child's pool

Without the first part, a child forked while another thread generated got the engine lock held by a thread that
does not exist there, and its first `generate` waited for ever. A fork from a callback inside a step (the forking
thread is in a turn) leaves that turn's state alone: the child is inside it.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

from hf_paged.batching.loop_driver import Driver

EngineLoop = Any  # (batching.engine_loop.EngineLoop, which imports this module: no import back)

__all__ = ["FORK_WAIT_S", "register"]

logger = logging.getLogger(__name__)

FORK_WAIT_S = 60.0  # how long a fork waits for a step another thread runs (a long prefill chunk takes seconds)
_LOOPS: weakref.WeakSet[EngineLoop] = weakref.WeakSet()
_held: dict[int, EngineLoop] = {}  # id -> loop whose engine lock the forking thread holds (between the hooks)


def register(loop: EngineLoop) -> None:
    _LOOPS.add(loop)


def _before_fork() -> None:
    for loop in list(_LOOPS):
        if loop.engine.lock.acquire(timeout=FORK_WAIT_S):
            _held[id(loop)] = loop
        else:
            logger.warning("hf_paged: forking while an engine step has run for %.0f s; in the child process that "
                           "wrapped model's engine is closed (unwrap and wrap it there to generate)", FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    held = list(_held.values())
    _held.clear()
    for loop in held:
        loop.engine.lock.release()


def _after_fork_in_child() -> None:
    held = dict(_held)
    _held.clear()
    for loop in list(_LOOPS):
        mine = held.get(id(loop)) is loop
        loop._cond, loop._thread = threading.Condition(), None
        if loop._turning == threading.get_ident():  # forked from a callback inside a step: this process is in it
            if mine:
                loop.engine.lock.release()
            continue
        loop._driver, loop._turning = Driver(), None
        if not mine:  # a step of another thread never ended: its state, and the engine's lock, are unusable here
            loop._closed = (None,)
            continue
        try:
            _drop_inherited(loop)
        finally:
            loop.engine.lock.release()


def _drop_inherited(loop: EngineLoop) -> None:
    """End the parent's requests and queued submissions in this child without delivering anything (under the
    engine's lock)."""
    engine = loop.engine
    for command in loop._commands:
        engine.release_request_ids(getattr(command, "request_ids", ()))
    loop._commands.clear()
    loop._num_pending = 0
    sinks, loop._sinks = loop._sinks, {}
    for rid in sinks:
        if rid in engine.requests:
            engine.abort(rid)
    engine.take_ended()
    for rid in sinks:
        engine.forget(rid)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
