"""Ghost history: what the prefix cache remembers of blocks it evicted. No torch, no tree code.

A cached block leaves the tree with its statistics; when its prefix comes back it would start from nothing, so a
document asked about every few pool turnovers looks like a one-off prompt each time (LFU's counts restart at 1).
The tree keeps the evicted blocks' digests with what the policy asks to remember (`CostPolicy.remember` and
`SLRUPolicy.remember`: uses and when they were counted), and hands it back when a block with that digest is cached
again (ARC's ghost lists, in spirit). Bounded: at most `capacity` entries, the least recently evicted dropped
first. Only policies that set `remembers_evicted` get one; LRU and LFU pay nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["GhostHistory"]

MemoryT = TypeVar("MemoryT")


class GhostHistory(Generic[MemoryT]):
    """Digest -> memory of recently evicted blocks, at most `capacity`, least recently evicted dropped first.

    Example:
        >>> ghosts = GhostHistory(2)
        >>> for digest in (b"a", b"b", b"c"):
        ...     ghosts.record(digest, 1.0)
        >>> ghosts.pop(b"a"), ghosts.pop(b"c"), len(ghosts)
        (None, 1.0, 1)
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"ghost history capacity must be an int >= 0, got {capacity!r}")
        self.capacity = capacity
        self._entries: OrderedDict[bytes, MemoryT] = OrderedDict()
        self.num_restored = 0  # memories handed back to a returning prefix

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._entries

    def record(self, digest: bytes, memory: MemoryT) -> None:
        """Remember an evicted block (replacing an older memory of the same digest)."""
        if not self.capacity:
            return
        self._entries.pop(digest, None)
        self._entries[digest] = memory
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def pop(self, digest: bytes) -> MemoryT | None:
        """The memory of `digest`, forgotten here (its block is cached again), or None."""
        memory = self._entries.pop(digest, None)
        self.num_restored += memory is not None
        return memory

    def clear(self) -> None:
        self._entries.clear()
