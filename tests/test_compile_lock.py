"""Where the kernels' compile lock lives: inside the numba cache it guards, not one more file in the temporary folder
for every installation that ever ran (`/tmp/hf_paged-compile-<digest>.lock` files were never removed)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from pathlib import Path

import hf_paged
from hf_paged import background_compile
from hf_paged.background_compile import Outcome, compile_in_child, lock_path

PACKAGE = Path(hf_paged.__file__).resolve().parent


def test_the_lock_lies_in_the_cache_it_guards(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert lock_path() == tmp_path / "numba" / "hf_paged-compile.lock"
    monkeypatch.delenv("NUMBA_CACHE_DIR")  # numba caches beside the sources, in __pycache__ folders
    assert lock_path() == PACKAGE / "__pycache__" / "hf_paged-compile.lock"


def test_a_read_only_installation_locks_in_the_temporary_folder(monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(background_compile.os, "access", lambda path, mode: False)
    path = lock_path()
    assert path.parent == Path(tempfile.gettempdir()) and path.name.startswith("hf_paged-compile-")


def test_a_compile_leaves_nothing_in_the_temporary_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # tempfile.gettempdir() answers this
    assert compile_in_child("pass", lambda: False).outcome is Outcome.COMPILED
    assert os.listdir(tmp_path) == []
    assert lock_path().exists()


def test_a_loader_returns_with_the_cache_complete_whatever_held_the_lock_before_it(monkeypatch, tmp_path):
    """The lock may be held by a compile of other kernels (the processors' loader, another variant, another
    process): once it comes free the loader reads the cache again and fills what is missing in its own child. It
    never gives up after some waits to compile on its thread (numba's compiler swaps the warning filters of every
    thread: a caller's `pytest.warns` missed its warning in CI)."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    lock_path().parent.mkdir(parents=True, exist_ok=True)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for other_fills_it in (False, True):
        results = []
        holder = os.open(lock_path(), os.O_RDWR | os.O_CREAT)
        fcntl.flock(holder, fcntl.LOCK_EX)
        loader = threading.Thread(target=lambda: results.append(
            compile_in_child(f"open({str(ours)!r}, 'w').close()", lambda: ours.exists() or theirs.exists())))
        loader.start()
        time.sleep(0.3)
        assert not results  # waiting for the lock
        if other_fills_it:
            theirs.touch()
        os.close(holder)  # (releases the lock)
        loader.join(60)
        assert results and ours.exists() != other_fills_it  # its own child ran only when the cache lacked it
        assert results[0].outcome is (Outcome.WAITED if other_fills_it else Outcome.COMPILED)
        ours.unlink(missing_ok=True)


def test_a_process_forked_while_the_lock_is_held_does_not_keep_it(monkeypatch, tmp_path):
    """A DataLoader worker forked while a loader thread compiles shares the lock's open file: unless it closes its
    copy, the lock stays held for the worker's life and every other process's loader waits that long."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    marker = tmp_path / "done"

    def compile_slowly():
        compile_in_child(f"import time; time.sleep(1); open({str(marker)!r}, 'w').close()", marker.exists)

    loader = threading.Thread(target=compile_slowly)
    loader.start()
    deadline = time.monotonic() + 30
    while not _held_elsewhere() and time.monotonic() < deadline:  # the loader holds it, its child sleeps
        time.sleep(0.02)
    pid = os.fork()
    if pid == 0:  # the worker: lives past the compile, touches nothing
        time.sleep(4)
        os._exit(0)
    try:
        loader.join(30)
        assert marker.exists() and not loader.is_alive()
        assert not _held_elsewhere(), "the forked process kept the compile lock"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def _held_elsewhere() -> bool:
    fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_the_processors_cache_counts_as_whole_only_once_its_child_finished(monkeypatch, tmp_path):
    """A compiling child that ends early (its parent gone, its grace over) leaves some kernels cached in part of
    their signatures: an entry for every kernel is not enough, the child's mark written after its last warm-up is."""
    from hf_paged.processors import jit

    assert jit.wait(1800), "the processors' kernels did not load"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(jit, "_cached", lambda dispatcher: True)  # an entry for every kernel
    assert not jit._complete()
    jit.compile_here()  # (every signature is loaded in this process already: it only writes the mark)
    assert jit._complete_mark().exists() and jit._complete()
