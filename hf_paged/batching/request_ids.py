"""`RequestIds`: request ids unique in an engine, claimed by callers before their requests are added.

A caller on any thread reserves ids at once (`Engine.reserve_request_id`, never waiting for a step); the request
is added later under its id (`Engine.add_reserved_request`, between two steps), or the id is given back.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Container, Iterable

__all__ = ["FORK_MARK", "RequestIds"]

FORK_MARK = "__child#"  # in the ids of a request's forks (`request.fork_ids`), never in an id a caller gives


class RequestIds:
    """The ids reserved and not yet added; `in_use` holds the ids of the requests already added."""

    def __init__(self, in_use: Container[str]) -> None:
        self.in_use = in_use
        self.reserved: set[str] = set()  # ids handed out by `reserve`, not yet added
        self.lock = threading.Lock()  # guards ids only (never held during a step)
        self._counter = itertools.count()
        _ALL.add(self)

    def reserve(self, request_id: str | None = None) -> str:
        """Claim `request_id` (a new unique one when None). Raises `ValueError` when it is in use or reserved,
        `TypeError` when it is not a str."""
        if request_id is not None and not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str (or None for a new unique one), got "
                            f"{type(request_id).__name__} {request_id!r}")
        with self.lock:
            if request_id is None:
                request_id = f"req_{next(self._counter)}"
                while self._taken(request_id):
                    request_id = f"req_{next(self._counter)}"
            elif self._taken(request_id):
                raise ValueError(f"request id {request_id!r} is already in use; pass a unique request_id (or none)")
            elif FORK_MARK in request_id:  # a fork of another request would take this id (num_return_sequences)
                raise ValueError(f"request id {request_id!r} contains {FORK_MARK!r}, which names the forks of a "
                                 "request with num_return_sequences > 1; pass an id without it (or none)")
            self.reserved.add(request_id)
            return request_id

    def release(self, request_ids: Iterable[str]) -> None:
        """Give back reserved ids that will not be added."""
        with self.lock:
            self.reserved.difference_update(request_ids)

    def take(self, request_id: str) -> None:
        """The reserved `request_id` is being added now. Raises `ValueError` when it was not reserved."""
        with self.lock:
            if request_id not in self.reserved:
                raise ValueError(f"request id {request_id!r} was not reserved; use add_request")
            self.reserved.discard(request_id)

    def _taken(self, request_id: str) -> bool:
        return request_id in self.in_use or request_id in self.reserved


_ALL: weakref.WeakSet[RequestIds] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child forked while another thread of the parent reserved an id would wait for ever on its copy of the lock
    (held by a thread that does not exist here): each gets a fresh one. (The ids set itself is never half-changed:
    its updates are single bytecodes.)"""
    for ids in list(_ALL):
        ids.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
