"""Compiling numba kernels in a child process: one child per cache at a time, none outliving its parent for long.

A process whose numba cache lacks kernels has a child compile them (its own interpreter and core, lowered
priority), never the caller's threads. Many processes often start together (torchrun, a Ray replica set, a script
run in a loop); they share one lock file per cache (`lock_path`):

    take the lock (waiting while another process fills the cache), then read the cache again:
      complete  -> another process filled it                                          -> WAITED
      missing   -> start the child with the lock's open file handed down (the lock lives as long as either
                   holds it), wait for the child                                      -> COMPILED or FAILED

Nothing compiles on the caller's threads, nor on a background thread of the caller's process unless its child
FAILED (no usable interpreter, say): numba's compiler enters `warnings.catch_warnings`, which swaps the process's
warning filters for all threads (Python < 3.14), so a compile on a loader thread made a caller's own
`catch_warnings` / `pytest.warns` miss the warnings raised meanwhile (seen in CI: a cold cache, two loaders of one
process waiting on each other, then compiling in their threads).

The child watches its parent. Once the parent is gone it has `ORPHAN_GRACE_S` seconds to finish, then ends: what
it compiled by then stays in the cache, and the next process compiles the rest.

A cached kernel is valid for the digest of every file its family compiles from (`sources_digest`, sealed into its
cache's stamp by `compat.seal_numba_cache`), not only for its own file as numba has it: a helper edited in another
module, or an upgrade, recompiles instead of loading a stale binary.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # (not POSIX: no lock, every process compiles for itself)
    fcntl = None  # type: ignore[assignment]

__all__ = ["ORPHAN_GRACE_S", "ChildResult", "Outcome", "child_main", "compile_in_child", "lock_path",
           "sources_digest"]

ORPHAN_GRACE_S = 20.0  # how long a child goes on compiling after its parent has exited
PARENT_ENV = "HF_PAGED_COMPILE_PARENT"  # the parent's pid, for the child's watch
_HELD: set[int] = set()  # the lock's descriptors open in this process now (a forked child closes its copies)


def _close_inherited() -> None:
    """In a forked child: close the copies of the lock's descriptors. A lock belongs to the open file, shared by
    every copy, so a DataLoader worker forked while a loader thread compiled would hold the lock as long as it
    lives, and every other process's loader (the other torchrun ranks) would wait that long."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


class Outcome(enum.Enum):
    COMPILED = "compiled"  # this process's child compiled (exit status 0)
    FAILED = "failed"  # this process's child failed (`ChildResult.detail` says why)
    WAITED = "waited"  # the cache was complete (filled by another process, or before this one asked)


@dataclass(slots=True, frozen=True)
class ChildResult:
    outcome: Outcome
    detail: str = ""  # the end of the child's stderr when it failed


@functools.cache
def sources_digest(*paths: str) -> str:
    """A digest of the package's files under `paths` (relative to `hf_paged/`: a file, or a folder's `*.py`): what
    a family of compiled kernels is built from, helpers in other modules included (`compat.seal_numba_cache`)."""
    root, digest = Path(__file__).resolve().parent, hashlib.blake2b(digest_size=8)
    for path in paths:
        for file in sorted((root / path).glob("*.py")) if (root / path).is_dir() else [root / path]:
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def lock_path() -> Path:
    """The lock of the numba cache in use, inside the cache it guards (nothing left in the temporary folder, and
    gone with the cache): in `NUMBA_CACHE_DIR` when set; otherwise numba caches beside this installation's sources
    (`__pycache__` folders), and the lock is `hf_paged/__pycache__/hf_paged-compile.lock`. An installation numba
    cannot write beside (read-only: numba uses its user-wide cache then) locks in the temporary folder, in a file
    named after the installation's path."""
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    if cache_dir:
        return Path(cache_dir) / "hf_paged-compile.lock"
    package = Path(__file__).resolve().parent
    in_tree = package / "__pycache__"
    try:
        in_tree.mkdir(exist_ok=True)
    except OSError:
        pass
    if os.access(in_tree, os.W_OK | os.X_OK):
        return in_tree / "hf_paged-compile.lock"
    digest = hashlib.blake2b(str(package).encode(), digest_size=8).hexdigest()
    return Path(tempfile.gettempdir()) / f"hf_paged-compile-{digest}.lock"


def compile_in_child(code: str, complete: Callable[[], bool], env: dict[str, str] | None = None) -> ChildResult:
    """Make the cache `complete()`: run `code` (Python source that compiles kernels and fills the cache) in a child
    process unless the cache is complete once this process holds the lock. Blocks (call it from a background
    thread) while another process compiles, however many do in turn: each waiter reads the cache when its turn
    comes, so the work is one compile per missing piece, never a count of rounds after which a loader gives up."""
    if complete():
        return ChildResult(Outcome.WAITED)
    if fcntl is None:
        return _run_child(code, env, None)
    path = lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    _HELD.add(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (until the compiling process, or its orphaned child, lets go)
        if complete():
            return ChildResult(Outcome.WAITED)
        return _run_child(code, env, fd)
    finally:
        _HELD.discard(fd)
        os.close(fd)


def _run_child(code: str, env: dict[str, str] | None, lock_fd: int | None) -> ChildResult:
    child_env = {**os.environ, **(env or {}), PARENT_ENV: str(os.getpid())}
    source = f"from hf_paged.background_compile import child_main; child_main({code!r})"
    done = subprocess.run([sys.executable, "-c", source], env=child_env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,
                          pass_fds=() if lock_fd is None else (lock_fd,))
    if done.returncode == 0:
        return ChildResult(Outcome.COMPILED)
    return ChildResult(Outcome.FAILED, done.stderr.decode(errors="replace")[-300:])


def child_main(code: str) -> None:
    """The child: lowered priority, a watch on the parent, then `code`."""
    try:
        os.nice(10)  # a background job: the user's processes keep the CPU when both want it
    except OSError:
        pass
    parent = int(os.environ.get(PARENT_ENV, "0"))
    if parent:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    exec(compile(code, "<hf_paged compile child>", "exec"), {})  # noqa: S102 - our own code, from our caller


def _watch_parent(parent: int, poll_s: float = 0.5) -> None:
    """End this process `ORPHAN_GRACE_S` seconds after its parent exits (orphans are re-parented)."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(0)  # the lock (a file handle of this process) is released with it
