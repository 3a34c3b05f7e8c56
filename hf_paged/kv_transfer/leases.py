"""`LeasedStore`: blocks put for another engine that nobody collects are freed.

A prefill engine writes every block it computes (`save_on="store"`) for a decode engine to load. When the decode
side never asks (the request was aborted, its decode replica died, the router sent it elsewhere), those blocks would
sit in the store for good. Each new block put through a `LeasedStore` holds a lease until some engine reads it
(`get`: collected); uncollected blocks are bounded, oldest freed first:

    max_blocks     at most this many uncollected blocks
    max_bytes      at most this many bytes of them
    lease_seconds  none older than this (a time bound, optional; measured by `clock`, injectable for tests)

A collected block stays in the store under the store's own bound (another engine may load it too); only the lease
ends. Works over any `KVStore` (in-process, the disk tier, Ray's object store).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from hf_paged.kv_transfer.stores import KVStore

__all__ = ["LeaseStats", "LeasedStore"]


@dataclass(slots=True)
class LeaseStats:
    leased_blocks: int = 0  # uncollected blocks now
    leased_bytes: int = 0
    collected_blocks: int = 0  # leases ended by a read
    expired_blocks: int = 0  # uncollected blocks freed (a bound, or their time, ran out)
    expired_bytes: int = 0


@dataclass(slots=True)
class _Lease:
    since: float  # clock() when put
    size: int


class LeasedStore:
    """Wraps `inner`; at least one bound must be given.

    Example:
        >>> store = LeasedStore(InProcessStore(), max_blocks=2)
        >>> for key in (b"a", b"b", b"c"): _ = store.put(key, b"blob")
        >>> store.contains(b"a"), store.stats.expired_blocks   # the oldest uncollected block was freed
        (False, 1)
    """

    def __init__(self, inner: KVStore, *, max_blocks: int | None = None, max_bytes: int | None = None,
                 lease_seconds: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        for name, value in (("max_blocks", max_blocks), ("max_bytes", max_bytes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"LeasedStore {name} must be an int >= 1 or None, got {value!r}")
        if lease_seconds is not None and (isinstance(lease_seconds, bool) or not lease_seconds > 0):
            raise ValueError(f"LeasedStore lease_seconds must be > 0 or None, got {lease_seconds!r}")
        if max_blocks is None and max_bytes is None and lease_seconds is None:
            raise ValueError("LeasedStore needs a bound on uncollected blocks: pass max_blocks, max_bytes or "
                             "lease_seconds (or use the store itself)")
        self.inner, self.clock = inner, clock
        self.max_blocks, self.max_bytes, self.lease_seconds = max_blocks, max_bytes, lease_seconds
        self.name, self.background_reads = inner.name, inner.background_reads
        self.stats = LeaseStats()
        self._leases: OrderedDict[bytes, _Lease] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def contains(self, key: bytes) -> bool:
        self.expire()
        return self.inner.contains(key)

    def get(self, key: bytes) -> bytes | None:
        self.expire()
        blob = self.inner.get(key)
        if blob is not None:
            with self._lock:
                if self._end(key) is not None:
                    self.stats.collected_blocks += 1
        return blob

    def put(self, key: bytes, data: bytes) -> bool:
        fresh = not self.inner.contains(key)
        if not self.inner.put(key, data):
            return False
        if fresh:
            with self._lock:
                if key not in self._leases:
                    self._leases[key] = _Lease(self.clock(), len(data))
                    self.stats.leased_blocks += 1
                    self.stats.leased_bytes += len(data)
        self.expire()
        return True

    def delete(self, key: bytes) -> None:
        with self._lock:
            self._end(key)
        self.inner.delete(key)

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def expire(self) -> int:
        """Free the uncollected blocks past a bound (oldest first); returns how many."""
        victims = []
        with self._lock:
            now = self.clock() if self.lease_seconds is not None else 0.0
            while self._leases:
                key, lease = next(iter(self._leases.items()))
                over = (self.max_blocks is not None and self.stats.leased_blocks > self.max_blocks) or (
                    self.max_bytes is not None and self.stats.leased_bytes > self.max_bytes) or (
                    self.lease_seconds is not None and now - lease.since >= self.lease_seconds)
                if not over:
                    break
                self._end(key)
                self.stats.expired_blocks += 1
                self.stats.expired_bytes += lease.size
                victims.append(key)
        for key in victims:
            self.inner.delete(key)
        return len(victims)

    def _end(self, key: bytes) -> _Lease | None:
        lease = self._leases.pop(key, None)
        if lease is not None:
            self.stats.leased_blocks -= 1
            self.stats.leased_bytes -= lease.size
        return lease
