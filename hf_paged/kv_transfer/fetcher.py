"""Reading stored blocks: one sequence's consecutive blobs read and checked, at once or in a background thread.

    read_blocks(store, layout, asks)   the blobs of consecutive blocks, each decoded and checked
                                       (`block_format.decode_block`), stopping at the first missing or refused one
    BlockFetcher.submit(seq, ...)      the same in a worker thread (one for the connector): file reads and the
                                       CRC-32 release the GIL, so the engine's forward runs meanwhile
    BlockFetcher.take(seq)             the finished read, handed to the connector once (it writes the blocks into
                                       the pool on the scheduler's thread: the pool and the tables have one owner)

A read touches only the store and the blobs; counting, deleting refused blobs and everything that changes the
engine happen on the scheduler's thread.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

from hf_paged.after_fork import call_after_fork
from hf_paged.errors import KVTransferError
from hf_paged.kv_transfer.block_format import DecodedBlock, decode_block
from hf_paged.kv_transfer.failure_log import FailureLog
from hf_paged.kv_transfer.layout import BlockLayout
from hf_paged.kv_transfer.stores import KVStore

__all__ = ["BlockAsk", "BlockFetcher", "FetchResult", "PendingFetch", "read_blocks"]


@dataclass(frozen=True, slots=True)
class BlockAsk:
    """One block to read: its store key, digest and token ids (checked against the blob's header)."""

    key: bytes
    digest: bytes
    token_ids: Sequence[int]


@dataclass(slots=True)
class FetchResult:
    blocks: list[DecodedBlock]  # consecutive blocks from the first asked, up to the first missing or refused
    refused: list[bytes]  # keys of blobs refused (corrupt, another layout): the caller deletes and counts them
    seconds: float  # time spent reading and checking


@dataclass(slots=True)
class PendingFetch:
    """A read in flight (or finished, not yet taken) for one sequence."""

    future: Future[FetchResult]
    first: int  # table index of the first block asked
    num_blocks: int  # blocks asked
    epoch: int  # the prefix cache's epoch when asked: after a reset (new weights) the blocks are stale
    asked: tuple = ()  # (layout, asks) of the read: a child forked mid-read reads again


def read_blocks(store: KVStore, layout: BlockLayout, asks: Sequence[BlockAsk],
                failures: FailureLog | None = None) -> FetchResult:
    """Read and check consecutive blocks; stop at the first blob missing or refused (a store that raised: the
    failure goes to `failures`)."""
    start, blocks, refused = time.perf_counter(), [], []
    for ask in asks:
        try:
            blob = store.get(ask.key)
            if blob is None:
                break
            blocks.append(decode_block(blob, layout, ask.digest, ask.token_ids))
        except KVTransferError:
            refused.append(ask.key)
            break
        except Exception as exc:  # noqa: BLE001 -- a store that failed to answer: stop here, the rest is recomputed
            if failures is not None:
                failures.record("load", repr(exc))
            break
    return FetchResult(blocks, refused, time.perf_counter() - start)


def count_held(store: KVStore, keys: Sequence[bytes], failures: FailureLog) -> tuple[int, bool]:
    """How many of `keys`, in order, the store holds (up to the first it lacks), and whether it failed to answer:
    a `contains` that raised (a network store that is down) is a miss there, logged once, as a failed read is."""
    n = 0
    for key in keys:
        try:
            if not store.contains(key):
                break
        except Exception as exc:  # noqa: BLE001 -- the rest is recomputed; the step goes on
            failures.record("lookup", repr(exc))
            return n, True
        n += 1
    return n, False


class BlockFetcher:
    """Reads in a worker thread, at most one per sequence; results wait until the connector takes them."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self.failures = FailureLog(f"KV reads from the {getattr(store, 'name', type(store).__name__)} store")
        self._pending: dict[Hashable, PendingFetch] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # the executor's creation (the table is the scheduler thread's alone)
        _LIVE.add(self)

    def __len__(self) -> int:
        """Reads asked and not yet taken or forgotten."""
        return len(self._pending)

    @property
    def num_blocks(self) -> int:
        """Blocks asked by the reads not yet taken (what they hold in memory once read)."""
        return sum(f.num_blocks for f in self._pending.values())

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._pending

    def submit(self, seq_id: Hashable, layout: BlockLayout, asks: Sequence[BlockAsk], *, first: int,
               epoch: int) -> None:
        asked = (layout, list(asks))
        self._pending[seq_id] = PendingFetch(self._read(asked), first, len(asks), epoch, asked)

    def _read(self, asked: tuple) -> Future[FetchResult]:
        return self._worker().submit(read_blocks, self.store, *asked, self.failures)

    def _worker(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf_paged-kv-fetch")
            return self._executor

    def _after_fork_in_child(self) -> None:
        """A child forked mid-read: the worker thread stayed in the parent, so its reads would never finish here
        (the requests waiting on them waited for ever, and so did every later read). The child takes a fresh lock
        and a worker of its own, and reads what was in flight again."""
        self._lock, self._executor = threading.Lock(), None
        for fetch in self._pending.values():
            if not fetch.future.done():
                fetch.future = self._read(fetch.asked)

    def is_done(self, seq_id: Hashable) -> bool:
        return self._pending[seq_id].future.done()

    def take(self, seq_id: Hashable) -> PendingFetch | None:
        """The sequence's finished read, once (None when there is none or it is still running)."""
        fetch = self._pending.get(seq_id)
        if fetch is None or not fetch.future.done():
            return None
        return self._pending.pop(seq_id)

    def forget(self, seq_id: Hashable) -> None:
        """The sequence ended or left: its read, finished or not, is dropped (never written anywhere)."""
        fetch = self._pending.pop(seq_id, None)
        if fetch is not None:
            fetch.future.cancel()

    def wait(self, timeout: float) -> None:
        """Block until some read finishes, at most `timeout` seconds (an engine with nothing else to run)."""
        futures = [f.future for f in self._pending.values()]
        if futures:
            wait_futures(futures, timeout=timeout, return_when="FIRST_COMPLETED")

    @property
    def has_thread(self) -> bool:
        return self._executor is not None

    def close(self) -> None:
        """Drop every read (finished or not) and stop the worker thread; a later `submit` starts one again."""
        for seq_id in list(self._pending):
            self.forget(seq_id)
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


_LIVE: weakref.WeakSet[BlockFetcher] = weakref.WeakSet()  # every fetcher of this process
call_after_fork(_LIVE, "_after_fork_in_child")
