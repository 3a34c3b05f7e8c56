"""The engine loop's own thread (`EngineLoop.start`), which holds its loop only weakly while it sleeps, so that a
loop nobody else holds (with its engine, model and KV pool) is collected and the thread ends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["serve", "wake"]


def serve(ref: Callable[[], Any], cond: threading.Condition) -> None:
    """The loop thread's body: turns while the loop has work, sleeping on `cond` between them. `ref()` gives the
    `EngineLoop`, or None once it is collected: a weak reference for `EngineLoop.start`'s thread, so that a wrapped
    model the caller drops (a notebook cell run again) is collected with its engine and KV pool and this thread
    ends, instead of the thread keeping all of it alive until the process exits (a turn, with a caller's request in
    flight, holds the loop strongly); the loop itself for `run_in_this_thread`."""
    while True:
        with cond:
            while True:
                loop = ref()
                if loop is None:
                    return
                if loop._has_work():
                    break
                del loop
                # idle: sleep until a caller submits or the loop is collected (`wake`); the timeout only covers
                # a collection that ran in this very thread between the check above and this wait
                cond.wait(timeout=60.0)
            stopping = loop._stopping
        if not loop._one_turn(stopping):
            return
        del loop


def wake(cond: threading.Condition) -> None:
    """The loop was collected: wake its thread so that it sees so and ends. Never blocks (a finalizer may run in
    any thread): a holder of `cond` is the loop thread itself, which checks the reference before it sleeps."""
    if cond.acquire(blocking=False):
        try:
            cond.notify_all()
        finally:
            cond.release()
