"""The block pool: which blocks exist, who holds them, which are free. No torch, no requests, no policy.

State and its invariants (`check_integrity()` proves them):

    every block is in exactly one of three states
      in use       ref_count > 0          held by that many live block tables (a shared block: > 1)
      idle cached  ref_count == 0, cached the prefix cache still maps it; evictable by the `Evictor`
      free         ref_count == 0, not cached, in the free queue (least recently freed first)
    free + idle cached + in use == num_blocks

`allocate` takes free blocks first and only then asks the evictor to give up idle cached blocks, so the prefix
cache keeps everything it can until memory is really needed. Which cached blocks go first (LRU, LFU, leaf first)
is the evictor's policy; the pool only hands out, shares and takes back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol


class Evictor(Protocol):
    """Policy that chooses which idle cached blocks to give back to the pool."""

    def evict(self, num_blocks: int) -> list[int]:
        """Drop the cache entries of `num_blocks` idle cached blocks and return their ids.

        The pool guarantees that at least `num_blocks` idle cached blocks exist when it calls this.
        """
        ...


class BlockPool:
    """Reference-counted blocks with a free queue in LRU order.

    Example:
        >>> pool = BlockPool(4)
        >>> ids = pool.allocate(3)
        >>> pool.num_free_blocks, pool.can_allocate(2)
        (1, False)
        >>> pool.free(ids); pool.num_free_blocks
        4
    """

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # Free blocks, least recently freed first: dict order is the queue, O(1) pop and removal.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: set[int] = set()  # blocks the prefix cache maps (any ref count)
        self._idle_cached: set[int] = set()  # cached with ref_count 0: evictable
        self.evictor: Evictor | None = None
        self.num_evictions = 0

    # -- queries ---------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an `allocate` can hand out now: free plus idle cached (evictable)."""
        return len(self._free) + len(self._idle_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free) - len(self._idle_cached)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def num_idle_cached_blocks(self) -> int:
        return len(self._idle_cached)

    def idle_cached_blocks(self) -> frozenset[int]:
        return frozenset(self._idle_cached)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._cached

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    # -- mechanism -------------------------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` blocks (ref_count 1 each); None when they do not fit (nothing changes then)."""
        if num_blocks < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({num_blocks})")
        if not self.can_allocate(num_blocks):
            return None
        shortfall = num_blocks - len(self._free)
        if shortfall > 0:
            self._evict(shortfall)
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            self.ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def incref(self, block_ids: Iterable[int]) -> None:
        """Share blocks with one more block table (a prefix hit, a fork)."""
        for block_id in block_ids:
            count = self.ref_counts[self._checked(block_id)]
            if count == 0:
                if block_id not in self._idle_cached:
                    raise RuntimeError(f"block {block_id} is free: it cannot be shared (allocate it instead)")
                self._idle_cached.discard(block_id)
            self.ref_counts[block_id] = count + 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block. Give tail blocks last-first so the queue frees them first."""
        for block_id in block_ids:
            count = self.ref_counts[self._checked(block_id)]
            if count <= 0:
                raise RuntimeError(f"block {block_id} freed twice (ref_count is already 0)")
            self.ref_counts[block_id] = count - 1
            if count == 1:
                if block_id in self._cached:
                    self._idle_cached.add(block_id)
                else:
                    self._free[block_id] = None

    def mark_cached(self, block_id: int) -> None:
        """The prefix cache now maps this block (it must be in use: only written blocks are cached)."""
        if self.ref_counts[self._checked(block_id)] <= 0:
            raise RuntimeError(f"block {block_id} is not in use: only a written block can be cached")
        self._cached.add(block_id)

    def uncache(self, block_id: int) -> None:
        """The prefix cache forgot this block; if nobody holds it, it becomes free."""
        if block_id not in self._cached:
            return
        self._cached.discard(block_id)
        if block_id in self._idle_cached:
            self._idle_cached.discard(block_id)
            self._free[block_id] = None

    def _checked(self, block_id: int) -> int:
        # A negative id would silently index from the end of `ref_counts` and corrupt another block's count.
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} is out of range: this pool has blocks 0..{self.num_blocks - 1}")
        return block_id

    def _evict(self, num_blocks: int) -> None:
        if self.evictor is None:  # no cache policy attached: any idle cached blocks are fair game
            victims = list(self._idle_cached)[:num_blocks]
        else:
            victims = self.evictor.evict(num_blocks)
        for block_id in victims:
            if block_id not in self._idle_cached:
                raise RuntimeError(f"evictor returned block {block_id}, which is not idle cached")
            self.uncache(block_id)
        self.num_evictions += len(victims)
        if len(victims) < num_blocks:
            raise RuntimeError(f"evictor gave back {len(victims)} blocks, {num_blocks} were needed")

    # -- invariants ------------------------------------------------------------------------------------
    def check_integrity(self, expected_ref_counts: dict[int, int] | None = None) -> None:
        """Assert the three-state invariant; with `expected_ref_counts` (block id -> number of live block
        tables holding it, from the owner of the tables) also assert every ref count."""
        free = set(self._free)
        assert len(free) == len(self._free), "free queue holds a block twice"
        assert free | self._cached <= set(range(self.num_blocks)), "a free or cached id is not a block of this pool"
        assert self._idle_cached <= self._cached, "an idle cached block is not cached"
        assert not (free & self._cached), "a free block is still cached"
        for block_id, count in enumerate(self.ref_counts):
            assert count >= 0, f"block {block_id} has negative ref_count {count}"
            if count > 0:
                assert block_id not in free and block_id not in self._idle_cached, f"block {block_id} in use and free"
            else:
                idle = block_id in self._idle_cached
                assert (block_id in free) != idle, f"block {block_id} with ref 0 is neither free nor idle cached"
        in_use = sum(1 for count in self.ref_counts if count > 0)  # counted, not derived from the other two
        assert len(free) + len(self._idle_cached) + in_use == self.num_blocks, "free + idle cached + in use != total"
        if expected_ref_counts is not None:
            for block_id, count in enumerate(self.ref_counts):
                want = expected_ref_counts.get(block_id, 0)
                assert count == want, f"block {block_id}: ref_count {count}, but {want} block tables hold it"
