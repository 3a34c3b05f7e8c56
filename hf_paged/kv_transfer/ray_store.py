"""`RayObjectStore`: KV blocks in Ray's object store, found through a small named actor (needs `hf_paged[ray]`).

    engine A (e.g. a prefill replica)              KVBlockDirectory (named actor)          engine B (a decode replica)
    put(key, blob) -> ray.put: A owns the object    key -> (ObjectRef, bytes), LRU,         contains(key): its mirror of
    buffered; flush(): register([...]) ---------->  bounded by blocks and bytes   <-------- the directory, synced on a
                                                    changes_since(cursor) -> adds, drops     miss; get(key): ray.get(ref)

How the work splits (after vLLM's KV connector, where the scheduler half asks "how many tokens does the outside
hold" and the worker half moves bytes, and SGLang's disaggregation, where a bootstrap service tells the decode side
where the prefill side left the KV): the *directory* only answers "who holds block digest D" with an `ObjectRef`; it
never touches the bytes. The bytes go from the writer's object store to the reader's through Ray (shared memory on
one node, Ray's object transfer between nodes), as the engine's own block format (`block_format.py`: header,
tensors as stored, CRC-32), so the reader checks the layout and the prefix exactly as for a file.

Leases, counted in blocks and bytes, never seconds: the directory holds at most `max_blocks` blocks and
`max_bytes` bytes; a block put or collected (read by some engine) moves to the young end, and the oldest go first
when room is needed. Dropping the directory's ref lets Ray free the object once the mirrors have synced (a mirror
learns of the drop at its next sync). A block that nobody collected before it fell out is counted
(`evicted_uncollected`). The object is owned by the engine process that put it: if that process dies, a reader's
`get` fails (Ray's `OwnerDiedError`), the block is forgotten everywhere, and the connector recomputes it (counted as
a load failure). A `get` waits at most `get_timeout_s` (a fault bound for an unreachable node, not a lease).

Round trips: `put` is local (`ray.put`) and registers in batches of `flush_blocks` (and at `flush()`, which a
prefill replica calls when a request's prefill is done); `contains` answers from the mirror and syncs once on a
miss (one round trip per admission that misses); collected keys and deletions ride the next round trip.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DIRECTORY_NAME", "DirectoryStats", "KVBlockDirectory", "RayObjectStore", "block_directory"]

DIRECTORY_NAME = "hf_paged_kv_directory"
NAMESPACE = "hf_paged"
_LOG_LIMIT = 1 << 16  # changes kept for mirrors; a mirror further behind gets the whole table


@dataclass(slots=True)
class DirectoryStats:
    """What the directory holds and what its leases did."""

    num_blocks: int = 0  # blocks registered now
    nbytes: int = 0  # their bytes
    registered_blocks: int = 0  # blocks registered since start (a block put twice counts once)
    collected_blocks: int = 0  # reads reported by the readers (a block read twice counts twice)
    evicted_blocks: int = 0  # blocks dropped to make room (their lease ran out)
    evicted_uncollected: int = 0  # of those, blocks nobody had read
    dropped_blocks: int = 0  # blocks dropped on a reader's word (lost with their owner, or refused)


class KVBlockDirectory:
    """Block key -> (ObjectRef, size), bounded by `max_blocks` and `max_bytes`, least recently used out first.

    Runs as a named Ray actor (`block_directory`); plain Python, so it is tested without Ray too. The refs are kept
    inside a one-element list, so Ray hands them over as refs (the actor borrows them), never resolved.
    """

    def __init__(self, max_blocks: int = 65536, max_bytes: int = 16 << 30) -> None:
        for name, value in (("max_blocks", max_blocks), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KVBlockDirectory {name} must be an int >= 1, got {value!r}")
        self.max_blocks, self.max_bytes = max_blocks, max_bytes
        self._entries: OrderedDict[bytes, tuple[list, int]] = OrderedDict()
        self._collected: set[bytes] = set()
        self._log: list[tuple[int, bytes, bool]] = []  # (seq, key, added): keys only, so the log holds no ref
        self._seq = 0
        self.stats = DirectoryStats()

    def register(self, entries: list[tuple[bytes, list, int]], collected: list[bytes] = (),
                 dropped: list[bytes] = ()) -> int:
        """Add blocks (key, [ref], size); take readers' reports (collected keys, dropped keys). Returns the cursor."""
        self._report(collected, dropped)
        for key, holder, size in entries:
            if key in self._entries:
                self._entries.move_to_end(key)
                continue
            if size > self.max_bytes:
                continue
            self._make_room(size)
            self._entries[key] = (holder, size)
            self.stats.registered_blocks += 1
            self.stats.nbytes += size
            self._append(key, True)
        self.stats.num_blocks = len(self._entries)
        return self._seq

    def changes_since(self, cursor: int, collected: list[bytes] = (), dropped: list[bytes] = ()) -> tuple:
        """(new cursor, reset, adds [(key, [ref], size)], drops [key]) past `cursor`; `reset`: the mirror was too
        far behind (or ahead: a new directory) and `adds` is the whole table."""
        self._report(collected, dropped)
        first = self._log[0][0] if self._log else self._seq + 1
        if cursor > self._seq or (cursor < first - 1 and cursor != self._seq):
            adds = [(k, holder, size) for k, (holder, size) in self._entries.items()]
            return self._seq, True, adds, []
        adds, drops = [], []
        for _, key, added in self._log[max(0, cursor - first + 1):]:
            if not added:
                drops.append(key)
            elif key in self._entries:  # (one dropped since is left out: its drop follows in the log)
                holder, size = self._entries[key]
                adds.append((key, holder, size))
        return self._seq, False, adds, drops

    def get_stats(self) -> dict[str, int]:
        return asdict(self.stats)

    # -- helpers --------------------------------------------------------------------------------------------
    def _report(self, collected, dropped) -> None:
        for key in collected:
            self.stats.collected_blocks += 1
            self._collected.add(key)
            if key in self._entries:
                self._entries.move_to_end(key)  # a read renews the lease
        for key in dropped:
            if key in self._entries:
                self.stats.dropped_blocks += 1
                self._remove(key)
        self.stats.num_blocks = len(self._entries)

    def _make_room(self, incoming: int) -> None:
        while self._entries and (len(self._entries) + 1 > self.max_blocks
                                 or self.stats.nbytes + incoming > self.max_bytes):
            key = next(iter(self._entries))
            self.stats.evicted_blocks += 1
            self.stats.evicted_uncollected += key not in self._collected
            self._remove(key)

    def _remove(self, key: bytes) -> None:
        _, size = self._entries.pop(key)
        self._collected.discard(key)
        self.stats.nbytes -= size
        self._append(key, False)

    def _append(self, key: bytes, added: bool) -> None:
        self._seq += 1
        self._log.append((self._seq, key, added))
        if len(self._log) > _LOG_LIMIT:
            del self._log[: len(self._log) - _LOG_LIMIT // 2]


def block_directory(name: str = DIRECTORY_NAME, *, namespace: str = NAMESPACE, max_blocks: int = 65536,
                    max_bytes: int = 16 << 30) -> Any:
    """The named directory actor, created on first use (detached: it outlives the replica that created it; a
    cluster's shutdown ends it). The bounds apply when this call creates it."""
    import ray

    actor = ray.remote(KVBlockDirectory).options(name=name, namespace=namespace, get_if_exists=True,
                                                 lifetime="detached", num_cpus=0, max_restarts=0)
    return actor.remote(max_blocks, max_bytes)


class RayObjectStore:
    """A `KVStore` over Ray's object store: blobs are `ray.put` by the writer and read by any engine of the cluster.

    Args:
        directory: the directory actor's name (every engine that shares blocks uses the same one).
        max_blocks / max_bytes: the directory's lease bounds (when this store creates it).
        flush_blocks: register puts with the directory in batches of this many (`flush()` sends the rest).
        get_timeout_s: the longest a read waits for an object (a node unreachable): then it is recomputed.
        sync_on_miss: a `contains` miss asks the directory for what changed (a reader); False: answer from what this
            store put and what `sync()` brought (a writer, e.g. a prefill replica: the connector asks `contains`
            before saving each new block, and a round trip per block would cost more than the block).

    Example:
        >>> store = RayObjectStore()                       # doctest: +SKIP  (inside ray.init())
        >>> engine = Engine(model, kv_store=store)          # doctest: +SKIP
        >>> ...; store.flush()                              # doctest: +SKIP  (another engine may now load them)
    """

    name = "ray-object-store"
    background_reads = True  # a read may cross nodes: the connector reads in its worker thread

    def __init__(self, directory: str = DIRECTORY_NAME, *, namespace: str = NAMESPACE, max_blocks: int = 65536,
                 max_bytes: int = 16 << 30, flush_blocks: int = 16, get_timeout_s: float = 30.0,
                 sync_on_miss: bool = True) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayObjectStore needs a Ray cluster: call ray.init() first (or run inside Ray)")
        if isinstance(flush_blocks, bool) or not isinstance(flush_blocks, int) or flush_blocks < 1:
            raise ValueError(f"flush_blocks must be an int >= 1, got {flush_blocks!r}")
        self._ray = ray
        self.directory = block_directory(directory, namespace=namespace, max_blocks=max_blocks, max_bytes=max_bytes)
        self.flush_blocks, self.get_timeout_s, self.sync_on_miss = flush_blocks, get_timeout_s, sync_on_miss
        self.max_blocks = max_blocks
        self._known: dict[bytes, tuple[Any, int]] = {}  # the mirror: key -> (ref, size)
        self._nbytes = 0
        self._cursor = 0
        self._pending: list[tuple[bytes, list, int]] = []  # put, not yet registered
        self._collected: list[bytes] = []  # read since the last round trip
        self._dropped: list[bytes] = []  # lost or deleted since the last round trip
        self._lock = threading.Lock()
        self.num_syncs = 0  # round trips to the directory for a miss
        self.num_lost = 0  # reads that failed (the owner died, a timeout): recomputed
        self.num_sync_failures = 0  # lookups whose sync with the directory failed (answered as misses)

    # -- KVStore ------------------------------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        with self._lock:
            if key in self._known:
                return True
            if not self.sync_on_miss:
                return False
            try:
                self._sync()
            except Exception:  # noqa: BLE001 -- the directory did not answer in get_timeout_s: a miss, recomputed
                self.num_sync_failures += 1
                return False
            return key in self._known

    def get(self, key: bytes) -> memoryview | None:
        """The blob under `key` (a read-only view of the object, zero-copy on one node), or None."""
        with self._lock:
            entry = self._known.get(key)
        if entry is None or entry[0] is None:  # (a writer keeps no refs: see _register)
            return None
        try:
            array = self._ray.get(entry[0], timeout=self.get_timeout_s)
        except Exception:  # noqa: BLE001 -- owner died, object lost, timeout: the block is recomputed
            with self._lock:
                self.num_lost += 1
                self._forget(key)
                self._dropped.append(key)
            return None
        with self._lock:
            self._collected.append(key)
        return memoryview(array)

    def put(self, key: bytes, data: bytes) -> bool:
        import numpy as np

        with self._lock:
            if key in self._known:
                return True
            ref = self._ray.put(np.frombuffer(data, dtype=np.uint8))
            self._known[key] = (ref, len(data))
            self._nbytes += len(data)
            self._pending.append((key, [ref], len(data)))
            if len(self._pending) >= self.flush_blocks:
                self._register()
            return True

    def delete(self, key: bytes) -> None:
        with self._lock:
            if key in self._known:
                self._forget(key)
                self._dropped.append(key)

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks this store knows of (its mirror of the directory)."""
        return self._nbytes

    # -- beyond KVStore -----------------------------------------------------------------------------------
    def flush(self, wait: bool = True) -> Any:
        """Register every put block with the directory (and send the collected / dropped reports); with `wait`,
        return once the directory holds them, so another engine's next `contains` finds them. Without `wait`,
        returns the call's ref (`await` it in async code)."""
        with self._lock:
            ref = self._register()
        if wait:
            self._ray.get(ref)
        return ref

    def knows(self, key: bytes) -> bool:
        """Whether the mirror holds `key` now (no round trip, whatever `sync_on_miss` says)."""
        with self._lock:
            return key in self._known

    def sync(self) -> None:
        """Take what changed in the directory now (a writer's mirror, or before a burst of reads)."""
        with self._lock:
            self._sync()

    def directory_stats(self) -> dict[str, int]:
        return self._ray.get(self.directory.get_stats.remote())

    # -- helpers (under the lock) -----------------------------------------------------------------------
    def _register(self):
        entries, self._pending = self._pending, []
        if not self.sync_on_miss:
            # A writer never syncs, so it must not keep refs: the directory's lease alone decides when Ray frees a
            # block (the call in flight keeps them alive until the directory holds them). It keeps the keys (so a
            # block is put once), the most recent `max_blocks` of them.
            for key, _, size in entries:
                if key in self._known:
                    self._known[key] = (None, size)
            while len(self._known) > self.max_blocks:
                self._forget(next(iter(self._known)))
        collected, self._collected = self._collected, []
        dropped, self._dropped = self._dropped, []
        return self.directory.register.remote(entries, collected, dropped)

    def _sync(self) -> None:
        if self._pending:
            self._register()  # our own puts first: the answer then includes them
        collected, self._collected = self._collected, []
        dropped, self._dropped = self._dropped, []
        self.num_syncs += 1
        cursor, reset, adds, drops = self._ray.get(
            self.directory.changes_since.remote(self._cursor, collected, dropped), timeout=self.get_timeout_s)
        if reset:
            self._known, self._nbytes = {}, 0
        for key in drops:
            self._forget(key)
        for key, holder, size in adds:
            if key not in self._known:
                self._known[key] = (holder[0], size)
                self._nbytes += size
        self._cursor = cursor

    def _forget(self, key: bytes) -> None:
        entry = self._known.pop(key, None)
        if entry is not None:
            self._nbytes -= entry[1]
