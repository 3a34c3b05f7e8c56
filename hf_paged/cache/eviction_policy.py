"""Eviction policies of the prefix cache: which idle cached block goes first. No torch, no tree code.

A policy is a sort key over what the tree records about each node; the node with the smallest key is evicted
first. `EvictionQueue` keeps the tree's nodes in that order. The tree touches whole root-to-node paths (a match
refreshes every block it serves, an insert every block of the path), so along any path from the root

    last_access(parent) >= last_access(child)      hit_count(parent) >= hit_count(child)
    priority(parent)    >= priority(child)          (insert raises an ancestor to its descendants' priority)

and every key below ends with `-depth`, so a parent always sorts after its children. The queue therefore meets
leaves before their parents and needs no separate leaf index (`RadixCache.check_integrity` asserts these
orderings; a custom policy that breaks them still works, only with more queue traffic).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Generic, Protocol, TypeVar

__all__ = [
    "EvictableNode",
    "EvictionPolicy",
    "EvictionQueue",
    "LFUPolicy",
    "LRUPolicy",
    "PriorityPolicy",
    "make_eviction_policy",
]


class EvictableNode(Protocol):
    """What a policy may read about a cached block (the tree's node has these fields)."""

    last_access: int  # logical clock of the last match or insert through this node
    hit_count: int  # 1 (its insert) + the number of matches that served it
    depth: int  # 1 for a first block of a prompt, 2 for the second, ...
    priority: int  # retention priority: higher is kept longer (0 unless inserts give one)
    block_id: int  # the pool block it maps
    version: int  # bumped by every `EvictionQueue.push`: older queue entries of the node are stale
    attached: bool  # False once the node left the tree


class EvictionPolicy(Protocol):
    """Orders idle cached blocks for eviction: the smallest `sort_key` goes first.

    `sort_key` must be a pure function of the node's fields (no clock, no randomness): the queue assumes a key
    changes only when the tree touches the node.
    """

    name: str

    def sort_key(self, node: EvictableNode) -> tuple[int, ...]: ...


class LRUPolicy:
    """Least recently used first; among blocks touched together, the deepest (the end of the prefix) first.

    Example:
        >>> from types import SimpleNamespace as Node
        >>> old = Node(last_access=1, hit_count=9, depth=1, priority=0)
        >>> new = Node(last_access=5, hit_count=1, depth=1, priority=0)
        >>> LRUPolicy().sort_key(old) < LRUPolicy().sort_key(new)
        True
    """

    name = "lru"

    def sort_key(self, node: EvictableNode) -> tuple[int, ...]:
        return (node.last_access, -node.depth)


class LFUPolicy:
    """Least frequently served first (ties: least recently used, then deepest).

    A prefix served to many requests (a system prompt) outlives a burst of one-off prompts that are more recent,
    which LRU would keep instead.
    """

    name = "lfu"

    def sort_key(self, node: EvictableNode) -> tuple[int, ...]:
        return (node.hit_count, node.last_access, -node.depth)


class PriorityPolicy:
    """Lowest retention priority first (ties: least recently used, then deepest).

    Inserts may pass `priority=`; e.g. a tenant's pinned system prompt with a high priority survives bulk traffic.
    """

    name = "priority"

    def sort_key(self, node: EvictableNode) -> tuple[int, ...]:
        return (node.priority, node.last_access, -node.depth)


_POLICIES: dict[str, type[LRUPolicy | LFUPolicy | PriorityPolicy]] = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "priority": PriorityPolicy,
}


def make_eviction_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """Return the policy named `policy` ("lru", "lfu", "priority"), or `policy` itself if it is one already.

    Example:
        >>> make_eviction_policy("lfu").name
        'lfu'
    """
    if isinstance(policy, str):
        try:
            return _POLICIES[policy]()
        except KeyError:
            raise ValueError(
                f"unknown prefix eviction policy {policy!r}; use one of {sorted(_POLICIES)} "
                "(PagedConfig.prefix_eviction_policy)"
            ) from None
    if not callable(getattr(policy, "sort_key", None)):
        raise TypeError(
            f"eviction policy must be a name or an object with sort_key(node) -> tuple, got {type(policy).__name__}"
        )
    return policy


NodeT = TypeVar("NodeT", bound=EvictableNode)


class EvictionQueue(Generic[NodeT]):
    """Nodes in eviction order: a lazy min-heap of (policy key, seq, version, node) plus a parked set.

    Touching a node only raises its key (newer access, more hits, higher priority), so an entry's key is a lower
    bound of the node's current key. Touches therefore cost nothing here: `pop` recomputes the key of the entry
    it meets and requeues it if it grew; an entry whose key is still current is the true minimum. `push` bumps the
    node's version, which makes its older entries stale. A node found in use is parked (it has no entry) and
    rechecked by `unpark` at the next eviction, so busy prefixes do not cycle through the heap on every call.
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self._heap: list[tuple[tuple[int, ...], int, int, NodeT]] = []
        self._parked: dict[NodeT, None] = {}
        self._seq = 0  # tiebreak: nodes themselves are never compared

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, node: NodeT) -> None:
        """(Re)queue `node` under its current key; its older entries become stale."""
        node.version += 1
        self._seq += 1
        heapq.heappush(self._heap, (self.policy.sort_key(node), self._seq, node.version, node))

    def pop(self) -> NodeT | None:
        """The attached node with the smallest current key (removed from the heap), or None when none is left."""
        while self._heap:
            key, _, version, node = heapq.heappop(self._heap)
            if not node.attached or version != node.version:
                continue  # stale
            if key < self.policy.sort_key(node):
                self.push(node)  # touched since it was queued: its place is further back
                continue
            return node
        return None

    def park(self, node: NodeT) -> None:
        self._parked[node] = None

    def unpark(self, ref_counts: Sequence[int]) -> None:
        """Requeue the parked nodes whose block became idle (ref count 0); forget the detached ones."""
        done = [node for node in self._parked if not node.attached or ref_counts[node.block_id] == 0]
        for node in done:
            del self._parked[node]
            if node.attached:
                self.push(node)

    def discard(self, node: NodeT) -> None:
        self._parked.pop(node, None)

    def rebuild(self, nodes: Iterable[NodeT]) -> None:
        """One fresh entry per node: drops stale entries (call when the heap outgrows the tree)."""
        self.clear()
        for node in nodes:
            self.push(node)

    def clear(self) -> None:
        self._heap.clear()
        self._parked.clear()

    def unqueued(self, nodes: Iterable[NodeT]) -> list[NodeT]:
        """The nodes among `nodes` with neither a live entry nor a parking place: they could never be evicted."""
        live = {id(node) for _, _, version, node in self._heap if node.attached and version == node.version}
        return [node for node in nodes if id(node) not in live and node not in self._parked]
