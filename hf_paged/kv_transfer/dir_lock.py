"""One engine process per KV directory: an exclusive `flock` on `<directory>/.lock`, held while a `DirectoryStore`
of this process has the directory open.

Why: a `DirectoryStore` counts only the files it wrote or found at start (two processes on one directory each keep
their own bound: 2-3x the bytes on disk), and sweeps leftover temporary files at start (another process's live
writes among them). Engines of one process may share a directory (a restart in a test, `kv_store=DirectoryStore`):
the lock is counted per process, and only its first opening sweeps. A forked child holds no lock of its own: its
store asks again and is refused while the parent holds it. The lock ends with the last store of this process on the
directory (`DirectoryStore.close`, or its collection) or with the process; the `.lock` file stays (its pid line is
rewritten by the next holder). Without `fcntl` (Windows), nothing is locked.

    lock(path)   -> True: this process took it now (first store)   False: a store of this process holds it already
                 -> KVDirectoryInUseError: another process holds it (its pid named when readable)
    unlock(path)    one store of this process let go; the last one releases the lock
    relock(path)    the directory was removed and made again: lock the new `.lock` file
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.errors import InvalidConfigError, KVDirectoryInUseError

try:
    import fcntl
except ImportError:  # pragma: no cover -- not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "lock", "relock", "unlock"]

LOCK_NAME = ".lock"


@dataclass(slots=True)
class _Held:
    fd: int  # the open `.lock` file whose flock this process holds (-1: no fcntl)
    pid: int  # the process that took it (a forked child finds its parent's entry: not its own)
    users: int  # stores of this process on the directory


_held: dict[str, _Held] = {}  # real path of the directory -> this process's lock on it
_guard = threading.Lock()
renew_locks_after_fork(globals(), "_guard")  # a forked child gets a free lock (after_fork.py)


def _key(path: str | os.PathLike) -> str:
    return os.path.realpath(path)


def lock(path: str | os.PathLike) -> bool:
    """Count one more store of this process on the directory `path`, taking its lock if no store here holds it.
    True when the lock was taken now (no store of this process had the directory open: temporary files left there
    belong to nobody). Raises `KVDirectoryInUseError` when another process holds it."""
    key = _key(path)
    with _guard:
        held = _held.get(key)
        if held is not None and held.pid == os.getpid():
            held.users += 1
            return False
        _held[key] = _Held(_take(path), os.getpid(), 1)  # (a parent's entry inherited through fork is replaced)
        return True


def unlock(path: str | os.PathLike) -> None:
    """One store of this process is done with the directory; the last one releases the lock."""
    key = _key(path)
    with _guard:
        held = _held.get(key)
        if held is None or held.pid != os.getpid():
            return
        held.users -= 1
        if held.users <= 0:
            del _held[key]
            _close(held.fd)


def relock(path: str | os.PathLike) -> None:
    """The directory was removed while open and made again: take the lock of its new `.lock` file (the old one went
    with the directory). Raises `KVDirectoryInUseError` when another process took it meanwhile."""
    key = _key(path)
    with _guard:
        held = _held.get(key)
        if held is None or held.pid != os.getpid():
            return
        fd = _take(path)
        _close(held.fd)
        held.fd = fd


def _take(path: str | os.PathLike) -> int:
    if fcntl is None:
        return -1
    file = os.path.join(path, LOCK_NAME)
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # (a `.lock` that is a directory: IsADirectoryError; one this process may not write)
        what = "is a directory" if isinstance(exc, IsADirectoryError) else f"cannot be opened ({exc.strerror or exc})"
        raise InvalidConfigError(
            f"the KV directory {os.fspath(path)!r} (kv_offload_dir) holds {file!r}, which {what}: that name is the "
            "directory's lock file; remove or rename it, or give another kv_offload_dir"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        os.close(fd)
        raise KVDirectoryInUseError(
            f"the KV directory {os.fspath(path)!r} (kv_offload_dir) is in use by another process "
            f"({f'pid {holder}' if holder else 'pid not readable'}, holding {file}); each engine process needs a "
            "directory of its own (a store counts and deletes its files alone): give this process another "
            "kv_offload_dir, or run the engines in one process"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
