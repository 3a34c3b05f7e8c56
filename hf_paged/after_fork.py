"""Fresh module-level locks in a forked child.

A process forked while another thread of the parent holds a lock (a DataLoader or multiprocessing pool forking its
workers while a thread compiles a constraint, heals a prompt or builds an engine) copies the lock held, by a thread
that does not exist in the child: the child's first `with` on it waits for ever. A module whose lock guards only
memo tables (each update one step under the lock) registers its lock names here, and the child starts with free
ones. (A `with` in the forking thread itself exits on the object it took, the old one: still balanced.)
"""

from __future__ import annotations

import os
import threading
from collections.abc import MutableMapping

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
