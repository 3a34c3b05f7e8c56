"""The disk tier's directory: one engine process per directory (a lock file), a temporary name per writer, a
directory removed while open made again, failures counted and logged once, and settings that could never save a
file refused when the engine is built."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hf_paged import Engine, PagedConfig
from hf_paged.errors import InvalidConfigError, KVDirectoryInUseError
from hf_paged.kv_transfer import DirectoryStore, InProcessStore, one_file_bytes
from hf_paged.kv_transfer import stores as stores_module
from tests.kv_transfer.test_engine_transfer import BS, disk_engine, evict_all, run, transfer_stats

ROOT = Path(__file__).resolve().parents[2]


def open_in_another_process(path: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from hf_paged.kv_transfer import DirectoryStore\n"
            "try:\n    DirectoryStore(sys.argv[1], 10_000)\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc); sys.exit(3)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_a_second_process_is_refused_the_directory_until_the_first_lets_go(tmp_path):
    store = DirectoryStore(tmp_path, 10_000)
    refused = open_in_another_process(tmp_path)
    assert refused.returncode == 3, refused.stderr
    assert refused.stdout.startswith("KVDirectoryInUseError") and repr(str(tmp_path)) in refused.stdout
    assert f"pid {os.getpid()}" in refused.stdout and "kv_offload_dir" in refused.stdout
    second = DirectoryStore(tmp_path, 10_000)  # engines of one process share it
    store.close()
    assert open_in_another_process(tmp_path).returncode == 3  # one store of this process still holds it
    second.close()
    assert open_in_another_process(tmp_path).returncode == 0, "the lock outlived the last store"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_does_not_inherit_the_directory(tmp_path):
    store = DirectoryStore(tmp_path, 10_000)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's lock is not its own
        signal.alarm(20)  # a child stuck on a lock another thread held at the fork dies instead of hanging the test
        try:
            DirectoryStore(tmp_path, 10_000)
            os.write(write, b"opened")
        except KVDirectoryInUseError:
            os.write(write, b"refused")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"refused"
    os.close(read)
    store.close()


def test_only_the_first_opening_in_a_process_sweeps_temporary_files(tmp_path):
    first = DirectoryStore(tmp_path, 10_000)
    live = tmp_path / ("ab" * 24 + ".kvb.12345-0.tmp")  # a write of the first store, in flight
    live.write_bytes(b"half")
    second = DirectoryStore(tmp_path, 10_000)
    assert live.exists()  # (every opening swept them, live writes included)
    first.close()
    second.close()
    DirectoryStore(tmp_path, 10_000).close()  # nobody writes here now: a crash's leftover
    assert not live.exists()


def test_every_write_has_a_temporary_name_of_its_own(tmp_path, monkeypatch):
    names = []
    real_replace = os.replace
    monkeypatch.setattr(stores_module.os, "replace", lambda src, dst: (names.append(Path(src).name),
                                                                       real_replace(src, dst))[1])
    a, b = DirectoryStore(tmp_path, 10_000), DirectoryStore(tmp_path, 10_000)
    assert a.put(b"k" * 24, b"one") and b.put(b"k" * 24, b"two")  # two writers of one key
    assert len(names) == 2 and names[0] != names[1] and all(n.endswith(".tmp") for n in names)
    assert str(os.getpid()) in names[0]


def test_a_removed_directory_is_made_again_at_the_next_save(tmp_path):
    path = tmp_path / "kv"
    store = DirectoryStore(path, 10_000)
    assert store.put(b"a" * 24, b"x" * 100)
    shutil.rmtree(path)
    assert store.put(b"b" * 24, b"y" * 50)  # (every later save failed, the directory never came back)
    assert store.nbytes == 50 and store.get(b"a" * 24) is None and store.get(b"b" * 24) == b"y" * 50
    assert (path / ".lock").exists()
    assert open_in_another_process(path).returncode == 3  # the new directory is locked too
    store.close()


def test_failures_are_counted_and_the_first_of_each_kind_logged(tmp_path, caplog):
    store = DirectoryStore(tmp_path, 100)
    with caplog.at_level(logging.WARNING, logger="hf_paged.kv_transfer"):
        assert not store.put(b"a" * 24, b"x" * 101)
        assert not store.put(b"b" * 24, b"x" * 200)
    assert store.failures.counts == {"save": 2}
    warnings = [r for r in caplog.records if r.name == "hf_paged.kv_transfer"]
    assert len(warnings) == 1 and "over the bound" in warnings[0].getMessage() and str(tmp_path) in \
        warnings[0].getMessage()


def test_a_file_whose_time_cannot_be_set_is_still_read(tmp_path, monkeypatch):
    """Touching a file read (its recency for a restart) may fail where reading does not (a file of another user
    on a shared tier): the bytes are served and the file kept; it was dropped as a failed load."""
    store = DirectoryStore(tmp_path, 100)
    assert store.put(b"k", b"x" * 10)

    def refuse(path, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(stores_module.os, "utime", refuse)
    assert store.get(b"k") == b"x" * 10 and store.get(b"k") == b"x" * 10
    assert store.contains(b"k") and store.failures.counts == {}
    store.close()


def test_a_save_the_store_refuses_is_counted(model, prompts, caplog):
    engine = Engine(model, PagedConfig(block_size=BS), kv_store=InProcessStore(max_bytes=100))  # no block fits
    with caplog.at_level(logging.WARNING, logger="hf_paged.kv_transfer"):
        run(engine, prompts[:1])
    assert transfer_stats(engine)["save_failures"] >= 5 and transfer_stats(engine)["saved_blocks"] == 0
    assert sum(r.name == "hf_paged.kv_transfer" for r in caplog.records) == 1


def test_a_bound_below_one_file_is_refused_with_the_minimum(model, prompts, tmp_path):
    probe = Engine(model, PagedConfig(block_size=BS))
    minimum = one_file_bytes(probe.cache, model)
    with pytest.raises(InvalidConfigError, match=f"give at least {minimum:,}"):
        disk_engine(model, tmp_path, kv_offload_bytes=minimum - 1)  # (passed: every save then failed)
    engine = disk_engine(model, tmp_path, kv_offload_bytes=minimum)
    run(engine, prompts[:1])
    evict_all(engine)
    sizes = [f.stat().st_size for f in tmp_path.glob("*.kvb")]
    assert len(sizes) == 1 and sizes[0] <= minimum  # one file fits, and it is the most one can take
    stats = transfer_stats(engine)
    assert stats["saved_blocks"] >= 5 and stats["save_failures"] == 0  # each file took the last one's place


def test_offload_settings_that_do_nothing_or_name_a_shell_path(model, tmp_path, monkeypatch):
    with pytest.raises(InvalidConfigError, match="kv_offload_bytes=4096 does nothing here.*kv_offload_dir"):
        PagedConfig(kv_offload_bytes=4096)  # (silently ignored)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("H60_KV_ROOT", str(tmp_path / "root"))
    for given, made in (("~/kv", tmp_path / "home" / "kv"), ("$H60_KV_ROOT/kv", tmp_path / "root" / "kv")):
        engine = Engine(model, PagedConfig(block_size=BS, kv_offload_dir=given))
        assert engine.scheduler.kv_transfer.store.inner.path == made and made.is_dir()
    assert not (Path.cwd() / "~").exists() and not (Path.cwd() / "$H60_KV_ROOT").exists()
