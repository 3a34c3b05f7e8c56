"""`WriteBehindStore`: a `KVStore` whose writes happen in a background thread, through a queue bounded by bytes.

    step thread:   save_blocks (a CPU copy of the block, before the pool reuses it) -> put_deferred(key, encode)
                   -> queued (or dropped and counted when the queue is full: a save is an optimisation)
    writer thread: oldest queued block -> encode (header, CRC-32) -> inner.put (file write, rename) -> dequeued

A block stays visible while queued: `contains` and `get` answer from the queue (a read of a block not yet written
encodes it on the reader's thread), so a save never races a read into a miss. `delete` of a queued block drops it
(or, when it is being written, deletes it once written: until then reads miss it, and a save of it again is written
after it). `flush` waits for the queue to empty; `close` flushes (or discards) and joins the thread. The thread also
ends after `idle_seconds` with nothing to write and starts again at the next save, so an engine that is never closed
leaves no thread behind for long.

Another engine of this process opening the same directory must see the files: `flush_writes_to(path)` flushes
every live writer over a `DirectoryStore` at that path (`connector_for` calls it before opening the disk tier).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hf_paged.after_fork import call_after_fork
from hf_paged.kv_transfer.failure_log import FailureLog
from hf_paged.kv_transfer.stores import DirectoryStore, KVStore

__all__ = ["WriteBehindStore", "WriterStats", "flush_writes_to"]

DEFAULT_QUEUE_BYTES = 64 * 2**20
_LIVE: weakref.WeakSet[WriteBehindStore] = weakref.WeakSet()
call_after_fork(_LIVE, "_after_fork_in_child")


@dataclass(slots=True)
class WriterStats:
    written_blocks: int = 0  # blocks the inner store took
    written_bytes: int = 0
    write_failures: int = 0  # inner.put returned False or raised (the block is only not saved)
    dropped_blocks: int = 0  # saves refused because the queue was full
    write_seconds: float = 0.0  # encoding and writing, in the writer thread


@dataclass(slots=True)
class _Queued:
    make: Callable[[], bytes]  # the blob (encoding happens on first need)
    size: int  # bytes counted against the queue's bound
    blob: bytes | None = None
    writing: bool = False
    deleted: bool = False

    def data(self) -> bytes:
        blob = self.blob
        if blob is None:  # two threads may both encode: the same bytes, the first stored wins nothing over the other
            blob = self.blob = self.make()
        return blob


class WriteBehindStore:
    """Wraps `inner` (any `KVStore`): writes go through a queue of at most `max_queue_bytes` to one writer thread.

    Example:
        >>> store = WriteBehindStore(InProcessStore())                  # doctest: +SKIP
        >>> store.put(b"k", b"blob"); store.get(b"k")                   # doctest: +SKIP
        (True, b'blob')
    """

    def __init__(self, inner: KVStore, *, max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
                 idle_seconds: float = 1.0) -> None:
        if isinstance(max_queue_bytes, bool) or not isinstance(max_queue_bytes, int) or max_queue_bytes < 1:
            raise ValueError(f"max_queue_bytes must be an int >= 1, got {max_queue_bytes!r}")
        self.inner, self.max_queue_bytes, self.idle_seconds = inner, max_queue_bytes, idle_seconds
        self.name, self.background_reads = inner.name, inner.background_reads
        self.counters = WriterStats()
        self.failures = FailureLog(f"KV writes to the {inner.name} store")
        self._queue: OrderedDict[bytes, _Queued] = OrderedDict()  # oldest first; owned under _cond
        self._queue_bytes = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        _LIVE.add(self)

    # -- KVStore ---------------------------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        queued = self._queue.get(key)
        if queued is not None:  # deleted while written: the inner store may hold it until the writer deletes it
            return not queued.deleted
        return self.inner.contains(key)

    def get(self, key: bytes) -> bytes | None:
        queued = self._queue.get(key)
        if queued is not None:
            return None if queued.deleted else queued.data()
        return self.inner.get(key)

    def put(self, key: bytes, data: bytes) -> bool:
        """Queue `data` under `key`; False when the queue is full (the save is dropped and counted)."""
        blob = bytes(data)
        return self.put_deferred(key, lambda: blob, len(blob))

    def put_deferred(self, key: bytes, make: Callable[[], bytes], size: int) -> bool:
        """Queue a blob that `make()` builds when it is written (or read first); `size`: its bytes, about."""
        with self._cond:
            queued = self._queue.get(key)
            if queued is not None and not queued.deleted:
                return True
            if queued is None and self.inner.contains(key):  # (deleted while written: the inner copy goes)
                return True
            if self._queue_bytes + size > self.max_queue_bytes:
                self.counters.dropped_blocks += 1
                return False
            self._queue[key] = _Queued(make, size)  # replacing one deleted while written: written after it (the
            self._queue_bytes += size  # writer keeps the old entry, `_run`; the key keeps its place: next in line)
            self._closing = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hf_paged-kv-write", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return True

    def delete(self, key: bytes) -> None:
        with self._cond:
            queued = self._queue.get(key)
            if queued is not None:
                if queued.writing:
                    queued.deleted = True  # the writer deletes it once written
                    return
                self._dequeue(key)
        self.inner.delete(key)

    @property
    def nbytes(self) -> int:
        """Bytes held by the inner store and queued for it."""
        return self.inner.nbytes + self._queue_bytes

    # -- the queue -------------------------------------------------------------------------------------
    @property
    def queued_blocks(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        return self._queue_bytes

    @property
    def is_writing(self) -> bool:
        """Whether the writer thread is alive."""
        return self._thread is not None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued block is written (or `timeout` seconds passed); True when the queue is empty."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue, timeout)

    def close(self, *, flush: bool = True) -> None:
        """Write (`flush`) or discard what is queued, then stop the writer thread. A later save starts it again."""
        with self._cond:
            if not flush:
                for key in [k for k, q in self._queue.items() if not q.writing]:
                    self._dequeue(key)
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _after_fork_in_child(self) -> None:
        """A child forked while the writer ran: its thread stayed in the parent, which writes what was queued then.
        The child drops its copy of the queue (a read of those blocks misses; the parent writes them), takes a fresh
        lock, and starts a writer of its own at its next save (before this, saves queued until the queue was full,
        and a `flush` waited for ever)."""
        self._cond = threading.Condition()
        self._queue, self._queue_bytes = OrderedDict(), 0
        self._thread, self._closing = None, False

    def _dequeue(self, key: bytes) -> None:
        queued = self._queue.pop(key)
        self._queue_bytes -= queued.size
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._queue or self._closing, self.idle_seconds) or not self._queue:
                    self._thread = None  # idle (or closing with nothing left): a later save starts a new thread
                    return
                key, queued = next(iter(self._queue.items()))
                queued.writing = True
            start = time.perf_counter()
            try:
                blob = queued.data()
                ok = self.inner.put(key, blob)
            except Exception as exc:  # noqa: BLE001 -- a failed save loses only the copy; the block stays in the pool
                ok, blob = False, b""
                self.failures.record("save", repr(exc))
            with self._cond:
                self.counters.write_seconds += time.perf_counter() - start
                if ok:
                    self.counters.written_blocks += 1
                    self.counters.written_bytes += len(blob)
                else:
                    self.counters.write_failures += 1
                deleted = queued.deleted  # read under the lock: a delete after this finds the key gone and deletes
                if self._queue.get(key) is queued:
                    self._dequeue(key)
                else:  # saved again after its delete (`put_deferred`): the new entry stays, written next
                    self._queue_bytes -= queued.size
                    self._cond.notify_all()
            if deleted and ok:
                self.inner.delete(key)


def flush_writes_to(path: str | os.PathLike, timeout: float | None = None) -> None:
    """Flush every live `WriteBehindStore` of this process writing into a `DirectoryStore` at `path` (before another
    store opens that directory: it lists the files that are there)."""
    target = Path(path).resolve()
    for writer in list(_LIVE):
        if isinstance(writer.inner, DirectoryStore) and writer.inner.path.resolve() == target:
            writer.flush(timeout)
