"""The disk tier's bookkeeping follows the files: a read moves a file's place in the LRU order across a restart (its
modification time), a directory removed under the store is forgotten whole at the first failed read (no block is
announced that is gone), and a new store of the directory first flushes the writes queued for it in this process
(and only those)."""

from __future__ import annotations

import os
import shutil

from hf_paged.kv_transfer import DirectoryStore, InProcessStore, WriteBehindStore, flush_writes_to

BLOB = b"x" * 100


def test_a_read_keeps_a_file_past_a_restart(tmp_path):
    store = DirectoryStore(tmp_path, 10_000)
    for i, key in enumerate((b"a", b"b", b"c")):
        store.put(key, BLOB)
        os.utime(store._file(key), ns=(10**18 + i * 10**9,) * 2)  # written long ago, a first
    assert store.get(b"a") == BLOB  # read now: the newest
    store.close()
    reopened = DirectoryStore(tmp_path, 2 * len(BLOB))  # room for two: the least recently used goes
    assert [reopened.contains(k) for k in (b"a", b"b", b"c")] == [True, False, True]
    reopened.close()


def test_a_removed_directory_is_forgotten_whole_at_the_first_failed_read(tmp_path):
    path = tmp_path / "kv"
    store = DirectoryStore(path, 10_000)
    for key in (b"a", b"b", b"c"):
        store.put(key, BLOB)
    shutil.rmtree(path)
    assert store.get(b"a") is None
    assert store.nbytes == 0 and not store.contains(b"b") and not store.contains(b"c")
    assert store.put(b"d", BLOB) and store.get(b"d") == BLOB  # made again at the next save
    store.close()


def test_flush_writes_to_flushes_the_writers_of_that_directory_only(tmp_path):
    flushed = []
    disk = WriteBehindStore(DirectoryStore(tmp_path / "kv", 10_000))
    other = WriteBehindStore(DirectoryStore(tmp_path / "other", 10_000))
    memory = WriteBehindStore(InProcessStore())
    for name, writer in (("disk", disk), ("other", other), ("memory", memory)):
        writer.flush = lambda timeout=None, name=name: flushed.append(name) or True
    flush_writes_to(tmp_path / "kv")
    assert flushed == ["disk"]
    disk.inner.close()
    other.inner.close()
