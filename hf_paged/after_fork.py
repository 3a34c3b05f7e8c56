"""Fresh module-level locks, and work redone, in a forked child.

A process forked while another thread of the parent holds a lock (a DataLoader or multiprocessing pool forking its
workers while a thread compiles a constraint, heals a prompt or builds an engine) copies the lock held, by a thread
that does not exist in the child: the child's first `with` on it waits for ever. A module whose lock guards only
memo tables (each update one step under the lock) registers its lock names here, and the child starts with free
ones. (A `with` in the forking thread itself exits on the object it took, the old one: still balanced.)

Work a thread of the parent was doing is lost the same way: `call_after_fork` lets a class redo it in the child (an
`IndexCache` reruns its orphaned builds), and `settle` hands a rerun's outcome to the future a caller already holds.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import MutableMapping
from concurrent.futures import Future

_RLOCK_TYPE = type(threading.RLock())


def renew_locks_after_fork(namespace: MutableMapping[str, object], *names: str) -> None:
    """In a forked child, bind each of `names` in `namespace` (a module's `globals()`) to a new lock of the same
    kind (`Lock` or `RLock`). The module must look the lock up by name at each use (`with _LOCK:`), never keep it
    elsewhere. Raises `KeyError` for a name not bound yet (register after the assignment)."""
    kinds = {name: threading.RLock if isinstance(namespace[name], _RLOCK_TYPE) else threading.Lock for name in names}

    def renew() -> None:
        for name, kind in kinds.items():
            namespace[name] = kind()

    os.register_at_fork(after_in_child=renew)


def call_after_fork(objects: weakref.WeakSet, method: str) -> None:
    """In a forked child, call `method` of every object still in `objects` (the instances of a class whose threads
    stay in the parent: an executor's workers, a loader)."""
    def redo() -> None:
        for obj in list(objects):
            getattr(obj, method)()

    os.register_at_fork(after_in_child=redo)


def settle(held: Future, done: Future) -> None:
    """Give `held` (a future whose work a fork orphaned: its thread stayed in the parent) the outcome of `done` (the
    same work run again in the child)."""
    if held.done():
        return
    error = done.exception()
    if error is not None:
        held.set_exception(error)
    else:
        held.set_result(done.result())
