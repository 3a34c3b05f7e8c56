"""Who steps an `EngineLoop`'s engine: a synchronous caller in its own thread (the driver), or the loop thread.

A synchronous caller (`generate`, `generate_batch`) drives its call's turns unless another synchronous caller
already drives, whose turns then step its requests too. Where the loop thread holds the turn when the caller
arrives (its turn after the previous call's hand-over: commands left behind, other callers' requests), the
caller waits for that one turn to end, and the loop thread takes no other while a caller waits. The caller adds
its requests only once it drives (`EngineLoop.follow`), so the loop thread never steps them.

Why: what a caller does between two steps (its stopping criteria's verdicts, `api/generate_criteria.py`) must take
effect before the next step, as in stock `generate`'s loop. With the loop thread stepping, a row stopped after
step k ran step k+1 too, or not, by the threads' timing; its extra draw from torch's global generator shifted the
other rows' samples: two runs of one seeded `generate` call gave different tokens (tests/test_interactions.py,
seen on a loaded machine).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Driver"]


class Driver:
    """The turn lock of one engine loop, and who holds it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: int | None = None  # the synchronous caller's thread that drives, if one does
        self._loop_turn = False  # the loop thread holds `lock` for a turn
        self._waiting = 0  # callers waiting for the loop thread's turn to end
        self._count = threading.Lock()  # guards `_waiting`

    @property
    def callers_waiting(self) -> bool:
        """A caller waits for the loop thread's turn: the loop thread takes no further turn until it drove."""
        return self._waiting > 0

    def take(self, me: int, *, always: bool = False) -> bool:
        """Make thread `me` the driver and return True; False where another synchronous caller drives (unless
        `always`: then wait until it leaves)."""
        if always:
            self.lock.acquire()
        else:
            while not self.lock.acquire(blocking=False):
                if self.owner is not None:
                    return False
                if self._loop_turn:
                    self._wait_for_the_loop_turn()
                    break
                time.sleep(0)  # the holder is between taking the lock and saying who it is (a few bytecodes)
        self.owner = me
        return True

    def _wait_for_the_loop_turn(self) -> None:  # (a caller taking the lock first in between is waited for too)
        with self._count:
            self._waiting += 1
        try:
            self.lock.acquire()
        finally:
            with self._count:
                self._waiting -= 1

    def release(self) -> None:
        """The driver leaves (its caller's requests ended)."""
        self.owner = None
        self.lock.release()

    @contextmanager
    def loop_turn(self) -> Iterator[None]:
        """The loop thread's turn: waits while a caller drives."""
        with self.lock:
            self._loop_turn = True
            try:
                yield
            finally:
                self._loop_turn = False
