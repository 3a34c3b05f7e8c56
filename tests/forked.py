"""Run a check in a forked child (the tests of what a process forked while background threads worked inherits)."""

from __future__ import annotations

import os
from collections.abc import Callable


def holds_in_forked_child(check: Callable[[], bool], after: Callable[[], None] = lambda: None) -> bool:
    """Whether `check()` returns True in a child forked now (an exception there reads as False; the child always
    ends). `after()` runs in the parent once the child has answered (opening a gate the parent's threads wait on)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = bool(check())
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    try:
        return os.read(read, 1) == b"1"
    finally:
        after()
        os.close(read)
        os.waitpid(pid, 0)
