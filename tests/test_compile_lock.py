"""Where the kernels' compile lock lives: inside the numba cache it guards, not one more file in the temporary folder
for every installation that ever ran (`/tmp/hf_paged-compile-<digest>.lock` files were never removed)."""

from __future__ import annotations

import os
import tempfile
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
    assert compile_in_child("pass").outcome in (Outcome.COMPILED, Outcome.WAITED)
    assert os.listdir(tmp_path) == []
    assert lock_path().exists()
