"""Eviction policies of the prefix cache: which idle cached block goes first. No torch, no tree code.

A policy is a sort key over what the tree records about each node; the node with the smallest key is evicted
first. `EvictionQueue` keeps the tree's nodes in that order. The tree touches whole root-to-node paths (a match
refreshes every block it serves, an insert every block of the path), so along any path from the root

    last_access(parent) >= last_access(child)      hit_count(parent) >= hit_count(child)
    priority(parent)    >= priority(child)          (insert raises an ancestor to its descendants' priority)

    value(parent)       >= value(child)             ("cost": a touch raises each ancestor to its child's value)

and every key below ends with `-depth`, so a parent always sorts after its children. The queue therefore meets
leaves before their parents and needs no separate leaf index (`RadixCache.check_integrity` asserts these
orderings; a custom policy that breaks them still works, only with more queue traffic).

"cost" (`CostPolicy`) is the one policy with state beyond the tree's counters: it sets each node's `value` when
the tree touches it (`revalue`) and asks the tree to remember evicted blocks' reuse (`remembers_evicted`).
`sort_key` still only reads node fields.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Generic, Protocol, TypeVar

__all__ = [
    "CostPolicy",
    "EvictableNode",
    "EvictionPolicy",
    "EvictionQueue",
    "LFUPolicy",
    "LRUPolicy",
    "PriorityPolicy",
    "SLRUPolicy",
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
    value: float  # "cost" only: retention value set at the last touch (0.0 under the other policies)
    reuse: float  # "cost" only: decayed count of the uses of this prefix (insert + hits), as of `reuse_clock`
    reuse_clock: float  # "cost" only: the tree's churn clock (pool turnovers) when `reuse` was last updated


class EvictionPolicy(Protocol):
    """Orders idle cached blocks for eviction: the smallest `sort_key` goes first.

    `sort_key` must be a pure function of the node's fields (no clock, no randomness): the queue assumes a key
    changes only when the tree touches the node.
    """

    name: str

    def sort_key(self, node: EvictableNode) -> tuple[float, ...]: ...


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


class CostPolicy:
    """Lowest retention value first, where a block's value is what a hit on it saves, times how often its prefix
    is used, on top of an aging floor (GreedyDual-Size-Frequency in our setting; ties: least recently used, then
    deepest).

        value = inflation + (reuse - 1 + first_use) x block_cost(depth)     block_cost(d) = 1 + attention_cost x d

    - `block_cost`: the prefill a hit saves, relative to one block's dense work (projections, MLP): a block at
      depth d also attends to d blocks, each `attention_cost` of that dense work (a dense decoder: about
      block_size / (6 x hidden); 16 / 1536 ~ 0.01 on the embedded model). A 4k-token document's tail costs more
      to recompute than a chat turn's first block.
    - `reuse`: uses of the prefix (its insert, then every hit), decayed by half every `half_life` pool
      turnovers (new blocks cached equal to the pool's size): old popularity fades with churn, never with seconds.
      An evicted block's reuse is remembered by the tree (`remembers_evicted`, `ghost_history.py`) and resumed
      when its prefix comes back, so a document asked about every few turnovers is recognised.
    - `first_use` (0.25): what a prefix's first use counts for, against 1 for each reuse. Most prefixes seen once
      are never seen again (one-off prompts), most seen twice come back (LRU-2's observation): a burst of
      one-off prompts then churns among itself and raises the floor slowly, while a document that came back
      holds its place for several turnovers. With 1.0 this is plain GDSF, and one burst of one-offs overtakes a
      twice-used document (measured: `benchmarks/prefix_eviction_results.md`).
    - `inflation`: the tree's aging floor, raised to the value of each block it evicts (GDSF's L). A touch stamps
      the current floor into the value, so a block nobody uses again is overtaken by fresher ones, however
      popular it was. The floor moves with evictions, so the order is deterministic.

    `revalue` raises each ancestor on a touched path to at least its child's value: evicting a parent makes the
    child unreachable, so a prefix is worth at least its most valuable extension (and the queue meets leaves
    first). Values never fall: a touch takes the larger of the old and the new value.

    Example:
        >>> from types import SimpleNamespace as Node
        >>> policy = CostPolicy()
        >>> doc, chat = (Node(depth=d, reuse=1.0, reuse_clock=0.0, value=0.0, last_access=1) for d in (40, 2))
        >>> policy.revalue([doc], hit=True, now=0.0, inflation=0.0)
        >>> policy.revalue([chat], hit=True, now=0.0, inflation=0.0)
        >>> policy.sort_key(chat) < policy.sort_key(doc)  # same reuse: the shallow block is cheaper to recompute
        True
    """

    name = "cost"
    valued = True  # the tree calls revalue / on_insert / remember and keeps the inflation floor
    remembers_evicted = True  # the tree keeps a ghost history of evicted blocks' reuse

    def __init__(self, *, attention_cost: float = 0.01, half_life: float = 8.0, ghost_factor: int = 4,
                 first_use: float = 0.25) -> None:
        if not attention_cost >= 0:
            raise ValueError(f"CostPolicy attention_cost must be >= 0 (relative to a block's dense work), "
                             f"got {attention_cost!r}")
        if not half_life > 0:
            raise ValueError(f"CostPolicy half_life must be > 0 pool turnovers, got {half_life!r}")
        if isinstance(ghost_factor, bool) or not isinstance(ghost_factor, int) or ghost_factor < 0:
            raise ValueError(f"CostPolicy ghost_factor must be an int >= 0 (ghosts per pool block), got "
                             f"{ghost_factor!r}")
        if not first_use > 0:
            raise ValueError(f"CostPolicy first_use must be > 0, got {first_use!r}")
        self.attention_cost, self.half_life, self.ghost_factor = attention_cost, half_life, ghost_factor
        self.first_use = first_use

    def sort_key(self, node: EvictableNode) -> tuple[float, ...]:
        return (node.value, node.last_access, -node.depth)

    def block_cost(self, depth: int) -> float:
        return 1.0 + self.attention_cost * depth

    def decayed(self, reuse: float, since: float, now: float) -> float:
        return reuse * 0.5 ** (max(0.0, now - since) / self.half_life)

    def revalue(self, path: Sequence[EvictableNode], *, hit: bool, now: float, inflation: float) -> None:
        """A touch of a root path (root's child first): count a use on a hit, then stamp values, deepest first."""
        below = 0.0
        for node in reversed(path):
            if hit:
                node.reuse = self.decayed(node.reuse, node.reuse_clock, now) + 1.0
                node.reuse_clock = now
            uses = node.reuse - 1.0 + self.first_use
            node.value = max(node.value, inflation + uses * self.block_cost(node.depth), below)
            below = node.value

    def on_insert(self, node: EvictableNode, remembered: tuple[float, float] | None, now: float) -> None:
        """A newly cached block: one use, plus what the ghost history remembered of its prefix (decayed)."""
        node.reuse = 1.0 + (self.decayed(*remembered, now) if remembered is not None else 0.0)
        node.reuse_clock = now

    def remember(self, node: EvictableNode) -> tuple[float, float]:
        """What the ghost history keeps of an evicted block: its reuse and when it was counted."""
        return (node.reuse, node.reuse_clock)


class SLRUPolicy:
    """Least recently used first, where a block whose prefix was used twice counts as used `protect` pool turnovers
    later than it was (segmented LRU with the protected segment bounded in time; ties: least recent, then deepest).

        value = churn at the last touch + (protect if protected else 0)       churn = blocks newly cached / pool blocks

    - protected: the block's prefix was used at least twice (its insert and a hit, or uses remembered from before an
      eviction: `remembers_evicted`, `ghost_history.py`), or the block extends a protected prefix (a chat's new turn
      behind a reused history or system prompt, a new question about a document asked before). Blocks used once
      under no reused prefix (one-off prompts) go first; among one class, plain LRU.
    - aging by construction: a protected block untouched for `protect` turnovers sorts behind every block touched
      since, whatever its past popularity (no count is read, only the class), so the protected blocks are at most
      the ones touched in the last ~`protect` + 1 turnovers.
    - why (`benchmarks/prefix_eviction_results.md`, round 3): the block-level model finds the 2Q class (twice-used
      first-class) worth +5-13 points on document workloads, and extending the class to a reused prefix's new
      blocks removes its losses on chat, where the next turn needs the once-used tail of the history.
      `protect` = 2 turnovers: 1 loses the issue's documents-between-bursts case (a document comes back every ~2.5
      turnovers there), 2-4 gave the same hit rates on every modelled workload.

    Example:
        >>> from types import SimpleNamespace as Node
        >>> policy = SLRUPolicy()
        >>> doc, one_off = (Node(depth=1, reuse=1.0, reuse_clock=0.0, value=0.0) for _ in range(2))
        >>> policy.revalue([doc], hit=True, now=0.0, inflation=0.0)  # used a second time: protected
        >>> policy.revalue([one_off], hit=False, now=0.5, inflation=0.0)  # newer, used once
        >>> (doc.value, one_off.value)
        (2.0, 0.5)
    """

    name = "slru"
    valued = True  # the tree calls revalue / on_insert / remember and keeps a churn clock
    remembers_evicted = True  # the tree keeps a ghost history of evicted blocks' uses

    def __init__(self, *, protect: float = 2.0, ghost_factor: int = 4) -> None:
        if isinstance(protect, bool) or not isinstance(protect, (int, float)) or not protect >= 0:
            raise ValueError(f"SLRUPolicy protect must be >= 0 pool turnovers, got {protect!r}")
        if isinstance(ghost_factor, bool) or not isinstance(ghost_factor, int) or ghost_factor < 0:
            raise ValueError(f"SLRUPolicy ghost_factor must be an int >= 0 (ghosts per pool block), got "
                             f"{ghost_factor!r}")
        self.protect, self.ghost_factor = float(protect), ghost_factor

    def sort_key(self, node: EvictableNode) -> tuple[float, ...]:
        return (node.value, node.last_access, -node.depth)

    def revalue(self, path: Sequence[EvictableNode], *, hit: bool, now: float, inflation: float) -> None:
        """A touch of a root path (root's child first): count a use on a hit, then stamp values (`inflation`, the
        tree's floor, is not used: the churn clock ages the values)."""
        protected = False
        for node in path:
            if hit:
                node.reuse += 1.0
                node.reuse_clock = now
            protected = protected or node.reuse >= 2.0
            node.value = max(node.value, now + (self.protect if protected else 0.0))
        below = 0.0
        for node in reversed(path):  # a prefix is worth at least its extension (the queue meets leaves first)
            node.value = below = max(node.value, below)

    def on_insert(self, node: EvictableNode, remembered: tuple[float, float] | None, now: float) -> None:
        """A newly cached block: one use, plus the uses the ghost history remembered of its prefix."""
        node.reuse = 1.0 + (remembered[0] if remembered is not None else 0.0)
        node.reuse_clock = now

    def remember(self, node: EvictableNode) -> tuple[float, float]:
        return (node.reuse, node.reuse_clock)


_POLICIES: dict[str, type[LRUPolicy | LFUPolicy | PriorityPolicy | CostPolicy | SLRUPolicy]] = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "priority": PriorityPolicy,
    "cost": CostPolicy,
    "slru": SLRUPolicy,
}


def make_eviction_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """Return the policy named `policy` ("lru", "lfu", "priority", "cost", "slru"), or `policy` itself if it is one already.

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
