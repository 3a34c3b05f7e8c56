"""Pinned prefixes: cached blocks a user keeps out of the prefix cache's eviction. No torch, no tree walking.

A pin covers a whole root path of cached blocks (the tree walks it and hands it here) and holds one pool reference
on each of its blocks, so the pool sees them in use and the evictor never takes them; no pinned block can hang
under an evictable one. Pins take pool room, so the caller bounds how many distinct blocks they may hold. State:

    ends[node]   times the root path ending at `node` was pinned
    node.pins    the pins covering `node` = sum of ends[e] over the pinned ends e at or below it
    num_blocks   nodes with pins > 0
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from hf_paged.cache.block_pool import BlockPool
from hf_paged.errors import PrefixPinLimitError

__all__ = ["PinnableNode", "PinnedPrefixes"]


class PinnableNode(Protocol):
    block_id: int
    pins: int  # pins covering this block
    parent: PinnableNode | None  # None for the root
    attached: bool  # False once the tree dropped the block


class PinnedPrefixes:
    """The pins of one prefix cache over its pool."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.ends: dict[PinnableNode, int] = {}  # deepest block of each pinned path -> times pinned
        self.num_blocks = 0  # distinct blocks pinned

    def pin(self, path: Sequence[PinnableNode], *, max_blocks: int) -> None:
        """Pin a root path (root's child first); `PrefixPinLimitError` if it would pin over `max_blocks` blocks."""
        new = sum(1 for n in path if not n.pins)
        if self.num_blocks + new > max_blocks:
            raise PrefixPinLimitError(
                f"pinning {len(path)} blocks ({new} not pinned yet) would pin {self.num_blocks + new} blocks, over "
                f"the limit of {max_blocks} of {self.pool.num_blocks} (PagedConfig.prefix_pin_share): unpin_prefix "
                "another prefix, pin a shorter one, or raise prefix_pin_share or num_blocks"
            )
        for n in path:
            n.pins += 1
        self.pool.incref([n.block_id for n in path])
        self.ends[path[-1]] = self.ends.get(path[-1], 0) + 1
        self.num_blocks += new

    def unpin(self, path: Sequence[PinnableNode]) -> int:
        """Undo one pin of the longest pinned path among `path`'s leading nodes; returns its length in blocks."""
        ends = [i for i, n in enumerate(path) if n in self.ends]
        if not ends:
            return 0
        path = path[: ends[-1] + 1]
        deepest = path[-1]
        self.ends[deepest] -= 1
        if not self.ends[deepest]:
            del self.ends[deepest]
        for n in path:
            n.pins -= 1
            self.num_blocks -= not n.pins
        self.pool.free([n.block_id for n in reversed(path)])
        return len(path)

    def release(self, nodes: Iterable[PinnableNode]) -> None:
        """Drop every pin (the cache forgets its blocks: call after uncaching them, so they become free)."""
        for n in nodes:
            if n.pins:
                self.pool.free([n.block_id] * n.pins)
                n.pins = 0
        self.ends.clear()
        self.num_blocks = 0

    def ref_counts(self, nodes: Iterable[PinnableNode]) -> dict[int, int]:
        return {n.block_id: n.pins for n in nodes if n.pins}

    def check_integrity(self, nodes: Iterable[PinnableNode], root: PinnableNode) -> None:
        """Every node's `pins` equals the pinned paths through it; `num_blocks` counts the pinned nodes."""
        pinned = self.ref_counts(nodes)
        covered: dict[int, int] = {}
        for end, count in self.ends.items():
            assert count > 0, f"block {end.block_id}: a pinned path with a zero count"
            walk: PinnableNode | None = end
            while walk is not None and walk is not root:
                covered[walk.block_id] = covered.get(walk.block_id, 0) + count
                walk = walk.parent
        assert covered == pinned, f"pins {pinned} but the pinned paths say {covered}"
        assert self.num_blocks == len(pinned), f"{self.num_blocks} pinned blocks counted, {len(pinned)} pinned"
