"""Hot blocks shared between colocated replicas: a block that got a prefix-cache hit is published for the others.

Colocated replicas (`hf-paged serve --replicas N --kv-share`) each compute their own prompts. A prefix one replica
holds and reuses (a hot system prompt, a document asked about again) is recomputed by every other replica the router
sends it to, and by a replica that just joined or restarted. With sharing, each replica's connector (`save_on="hot"`):

    publishes   at admission, the blocks of the request's local prefix hit that the directory does not know yet
                (a hit proves the block is reused; a block computed once and never hit stays private): copied out
                of the pool, encoded in the engine's block format, `ray.put`, registered with the directory without
                waiting (`flush(wait=False)`). The hit never holds the request's last token (`add_sequence` matches
                all tokens but the last), so neither does a published block.
    loads       the blocks past its local hit that the directory knows, when the cost model says loading beats
                recomputing (the connector's scheduler half, unchanged): read in the background while the request
                waits, written into fresh blocks, cached in the prefix tree as normal blocks.

`PeerStore` wraps the `RayObjectStore` so that lookups cost at most one round trip to the directory per engine step
(`new_round`, called as each step is planned): a miss syncs the mirror once, the other misses of that step answer
from it. A mirror a step stale only costs a recompute. And a miss may sync only for a prompt whose blocks past its
local hit take longer to recompute than `ASK_FACTOR` round trips (both measured: the cost model's prefill speed, the
store's own syncs): a lookup that finds blocks costs a round trip, then the read; one that misses, the round trip
for nothing. A short prompt (one block past its hit: ~3 ms of prefill here against ~1 ms a round trip) then costs no
round trip (but one lookup in `EXPLORE_EVERY` kept from asking, which measures the round trip again; measured in
benchmarks/kv_share_results.md).
Bounds are the directory's leases (blocks and bytes, least recently used out first): a block falls out of the
directory, and Ray frees it once the mirrors have synced the drop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hf_paged.kv_transfer.cost_model import Rate, TransferCostModel
from hf_paged.kv_transfer.ray_store import RayObjectStore
from hf_paged.kv_transfer.saver import BlockSaver
from hf_paged.kv_transfer.stores import KVStore

__all__ = ["ASK_FACTOR", "HotBlock", "HotBlockPublisher", "PeerStore"]

ASK_FACTOR = 4.0  # a miss syncs only for blocks worth this many round trips of recompute
EXPLORE_EVERY = 16  # after this many lookups kept from syncing in a row, one may sync (the round trip is measured
# again: one sync that brought a large change would otherwise keep every later lookup from asking)


class PeerStore:
    """A `KVStore` over the blocks every replica published: lookups sync the mirror at most once a round.

    Args:
        inner: the shared store; a `RayObjectStore` (its directory mirror is synced on a miss, once a round) or any
            other `KVStore` (asked directly: an in-process store needs no sync).
    """

    def __init__(self, inner: KVStore) -> None:
        self.inner = inner
        self.name, self.background_reads = inner.name, inner.background_reads
        self._mirror = inner if isinstance(inner, RayObjectStore) else None
        self._synced = False  # this round's sync done
        self.may_sync = True  # the lookup in progress is worth a round trip (`HotBlockPublisher.worth_asking`)
        self.num_syncs = 0
        self.num_sync_failures = 0  # syncs that raised (counted as misses: the blocks are recomputed)
        self.sync_seconds = Rate(1e3, 1e-3, 0.9)  # round trips per second (decayed; prior: 1 ms each)

    def contains(self, key: bytes) -> bool:
        if self._mirror is None or self._mirror.knows(key):
            return self.inner.contains(key)
        if self._synced or not self.may_sync:
            return False
        self._synced = True
        self.num_syncs += 1
        start = time.perf_counter()
        try:
            self._mirror.sync()
        except Exception:  # noqa: BLE001 -- the directory did not answer (a timeout, it died): a miss, recomputed
            self.num_sync_failures += 1
            return False
        finally:
            self.sync_seconds.observe(1, time.perf_counter() - start)
        return self._mirror.knows(key)

    def knows(self, key: bytes) -> bool:
        """Whether the mirror holds `key` now (never a round trip)."""
        return self._mirror.knows(key) if self._mirror is not None else self.inner.contains(key)

    def new_round(self) -> None:
        """A step is planned: the next miss may sync the mirror again."""
        self._synced = False

    def register(self) -> None:
        """Hand the blocks just put to the directory, without waiting (the next step's lookups of other replicas
        find them once the directory took them)."""
        if self._mirror is not None:
            self._mirror.flush(wait=False)

    def get(self, key: bytes) -> Any:
        return self.inner.get(key)

    def put(self, key: bytes, data: bytes) -> bool:
        return self.inner.put(key, data)

    def delete(self, key: bytes) -> None:
        self.inner.delete(key)

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes


@dataclass(frozen=True, slots=True)
class HotBlock:
    """A cached block to publish: what the saver reads of a prefix-tree node."""

    digest: bytes
    block_id: int  # the pool block holding its K/V (held by the admitted request: not reused while it is saved)
    token_ids: tuple[int, ...]


class HotBlockPublisher:
    """Publishes the blocks of local prefix hits that the shared store does not know yet.

    `keys` maps digests to store keys (the connector's layout namespace); `saver` copies, encodes and puts them
    (its counters: `saved_blocks` / `saved_bytes` count what was published)."""

    def __init__(self, store: PeerStore, saver: BlockSaver, keys: Callable[[Sequence[bytes]], list[bytes]],
                 block_size: int) -> None:
        self.store, self.saver, self._keys, self.block_size = store, saver, keys, block_size
        self._kept_from_asking = 0  # lookups in a row that `worth_asking` kept from syncing

    def worth_asking(self, num_tokens: int, cost: TransferCostModel) -> bool:
        """Whether `num_tokens` past a local hit take longer to recompute than `ASK_FACTOR` round trips to the
        directory (a miss may then sync the mirror: `PeerStore.may_sync`)."""
        round_trip = 1.0 / self.store.sync_seconds.per_second  # (the rate counts round trips per second)
        worth = num_tokens / cost.prefill.per_second > ASK_FACTOR * round_trip
        self._kept_from_asking = 0 if worth else self._kept_from_asking + 1
        if self._kept_from_asking >= EXPLORE_EVERY:
            worth, self._kept_from_asking = True, 0
        self.store.may_sync = worth
        return worth

    def publish(self, digests: Sequence[bytes], token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        """Publish the leading blocks `block_ids` (a request's local hit: `digests` and `token_ids` of the same
        blocks) that the store lacks; returns how many were put."""
        bs = self.block_size
        fresh = [HotBlock(d, int(b), tuple(int(t) for t in token_ids[i * bs : (i + 1) * bs]))
                 for i, (d, b, key) in enumerate(zip(digests, block_ids, self._keys(digests)))
                 if not self.store.knows(key)]
        if not fresh:
            return 0
        done = self.saver.save(fresh)  # type: ignore[arg-type]  # (reads digest, block_id, token_ids)
        if done:
            self.store.register()
        return done
