"""The prefix cache: a tree whose edges are full blocks, keyed by chained digests. No torch.

    root ─ [sys prompt 0..15] ─ [sys prompt 16..31] ─┬─ [question A 32..47]
                                                     └─ [question B 32..47] ─ [answer B 48..63]

A node is one full block: its `block_size` token ids, the pool block that holds their KV, and
`digest = block_digest(parent digest, token ids, extra keys)` (`digests.py`). A block's KV depends on every token
before it, so a node is only reachable through its whole prefix. A match is verified on the tokens (and extra
keys), never on the digest alone. The tree takes no references: the caller `pool.incref`s what it keeps; the tree
only marks its blocks cached in the pool and, as the pool's `Evictor`, gives idle ones back, leaves first, in
policy order.

Eviction order: an `EvictionQueue` (eviction_policy.py), statistics read lazily; "cost" adds a churn clock, an
inflation floor and a ghost history (ghost_history.py). `listen()`: a log of block events (block_events.py) for a
router; `block_sink` (kv_transfer/) hears of blocks stored and evicted while they hold K/V. `partial_block`: past
a match, the cached block sharing the most of the next tokens.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hf_paged.cache.block_events import BlockEventKind, BlockEventLog
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.digests import chained_digest, encode_extra_keys, prefix_digests
from hf_paged.cache.eviction_policy import EvictionPolicy, EvictionQueue, make_eviction_policy
from hf_paged.cache.ghost_history import GhostHistory
from hf_paged.cache.prefix_pins import PinnedPrefixes
from hf_paged.cache.tree_checks import check_insertable, check_tree
from hf_paged.cache.tree_nodes import (
    BlockSink,
    InsertResult,
    PrefixMatch,
    TreeNode,
    TreeWalk,
    longest_partial_child,
    own_path,
)

__all__ = ["InsertResult", "PrefixMatch", "RadixCache", "prefix_digests"]
_PARTIAL_SCAN = 32  # children `partial_block` compares at most (bounded work at a node with many children)


class RadixCache:
    """Prefix tree over full blocks of a `BlockPool`; registers itself as the pool's evictor.

    Args:
        pool: the block pool whose blocks the tree maps. It must hold no cached blocks yet.
        block_size: tokens per block.
        policy: eviction order of idle cached blocks: "lru" (default), "lfu", "priority", "cost", or a policy
            object (one per tree: "cost" keeps no state itself, the tree keeps its clock, floor and ghosts).

    Example:
        >>> pool = BlockPool(8); cache = RadixCache(pool, block_size=2)
        >>> ids = pool.allocate(2); _ = cache.insert([1, 2, 3, 4, 5], ids); pool.free(ids)
        >>> cache.match([1, 2, 3, 9])
        PrefixMatch(block_ids=[0], num_tokens=2)
    """

    def __init__(self, pool: BlockPool, block_size: int, *, policy: str | EvictionPolicy = "lru") -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if pool.num_cached_blocks:
            raise ValueError(
                f"the pool already has {pool.num_cached_blocks} cached blocks from another prefix cache; "
                "call that cache's reset() first, or give this one a fresh pool"
            )
        self.pool, self.block_size = pool, block_size
        self.policy = make_eviction_policy(policy)
        self._root = TreeNode(token_ids=(), block_id=-1, digest=None, parent=None, extra_keys=(), depth=0)
        self._node_of_block: dict[int, TreeNode] = {}
        self._queue: EvictionQueue[TreeNode] = EvictionQueue(self.policy)
        self._clock = 0
        # Valued policies ("cost"): their hooks, a churn clock, the inflation floor and the ghost history.
        self._valuer = self.policy if getattr(self.policy, "valued", False) else None
        self._num_stored = 0  # blocks newly cached so far (the churn clock, in blocks)
        self.inflation = 0.0  # value of the last block evicted (only ever raised)
        self.ghosts: GhostHistory | None = None
        if getattr(self.policy, "remembers_evicted", False):
            self.ghosts = GhostHistory(getattr(self.policy, "ghost_factor", 4) * pool.num_blocks)
        self.num_queries = self.num_hits = self.num_query_tokens = self.num_hit_tokens = self.num_evicted = 0
        self.counting = True  # lookups count in the hit statistics (off while a KV load stages its blocks)
        self.epoch = 0  # bumped by reset(): KV computed in an older epoch must not be inserted
        self.events: BlockEventLog | None = None  # set by listen(): nothing is recorded before
        self._pins = PinnedPrefixes(pool)  # prefixes kept out of eviction (`pin`)
        self.block_sink: BlockSink | None = None  # told of blocks stored and evicted (kv_transfer saves them)
        self._departed: list[TreeNode] = []  # nodes one `evict` call removed, for the sink
        pool.evictor = self

    def listen(self, capacity: int = 65536) -> BlockEventLog:
        """Start recording block events (stored, removed, cleared) in a log of `capacity`; returns it. Called
        again, returns the same log (every consumer keeps its own cursor into it)."""
        if self.events is None:
            self.events = BlockEventLog(capacity)
        return self.events

    @property
    def num_cached_blocks(self) -> int:
        return len(self._node_of_block)

    @property
    def num_ghosts(self) -> int:  # evicted blocks whose reuse the "cost" policy remembers (0 for the others)
        return len(self.ghosts) if self.ghosts is not None else 0

    # -- lookup ----------------------------------------------------------------------------------------
    def match(self, token_ids: Sequence[int], extra_keys: tuple = ()) -> PrefixMatch:
        """Longest cached prefix of full blocks equal to `token_ids`' (checked token by token). Refreshes the served
        blocks for eviction but takes no reference: `pool.incref` the ids you keep. To always recompute a prompt's
        last token (its logits are needed), pass `token_ids[:-1]`."""
        bs, path = self.block_size, self._walk(token_ids, extra_keys).path
        self._touch(path, hit=True)
        if self.counting:
            self.num_queries += 1
            self.num_hits += bool(path)
            self.num_query_tokens += len(token_ids)
            self.num_hit_tokens += len(path) * bs
        return PrefixMatch(block_ids=[n.block_id for n in path], num_tokens=len(path) * bs)

    def partial_block(self, after: int | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> tuple[int, int]:
        """(block id, tokens) of the cached block following block `after` (None: the root) that begins with the
        most of `token_ids`, fewer than a block; (-1, 0) if none. Refreshes and counts nothing (the caller copies)."""
        node = self._root if after is None else self._node_of_block.get(after)
        child, n = (None, 0) if node is None else longest_partial_child(
            node, [int(t) for t in token_ids[: self.block_size - 1]], tuple(extra_keys), _PARTIAL_SCAN)
        return (child.block_id, n) if child is not None else (-1, 0)

    def digests(self, token_ids: Sequence[int], extra_keys: tuple = ()) -> list[bytes]:
        """Chained digests of the full blocks of `token_ids` with this cache's block size."""
        return prefix_digests(token_ids, self.block_size, extra_keys)

    def peek(self, token_ids: Sequence[int], extra_keys: tuple = (), digests: Sequence[bytes] | None = None) -> int:
        """Tokens of the longest cached prefix (full blocks), refreshing nothing and counting no query. With `digests`
        (this sequence's `digests()`, computed once by the caller) nothing is hashed again."""
        return len(self._walk(token_ids, extra_keys, digests).path) * self.block_size

    def cached_digests(self, limit: int | None = None) -> list[bytes]:
        """Digests of up to `limit` cached blocks, most recently used first, every block after its parent: any
        leading slice of the answer is closed under prefixes (a parent is never used less recently than its child),
        so a capped list never names a block whose prefix it omits: what a replica reports for routing."""
        nodes = [n for n in list(self._node_of_block.values()) if len(n.token_ids) == self.block_size]  # no tails
        nodes.sort(key=lambda n: (-n.last_access, n.depth))
        return [n.digest for n in (nodes if limit is None else nodes[: max(0, limit)])]  # type: ignore[misc]

    def cached_nodes(self) -> list[TreeNode]:
        """Every cached block's node (digest, block id, token ids), a copy: what a KV connector saves at shutdown."""
        return [n for n in list(self._node_of_block.values()) if len(n.token_ids) == self.block_size]

    def is_inflight(self, token_ids: Sequence[int], extra_keys: tuple, inflight_digests: Collection[bytes],
                    digests: Sequence[bytes] | None = None) -> bool:
        """Whether the first full block of `token_ids` past its cached prefix is being computed right now
        (`inflight_digests`: the `digests()` of the prompts still in prefill): admitting the request a step later
        turns that block (and what follows it) into a hit instead of a second computation. Refreshes nothing."""
        if not inflight_digests:
            return False
        return self._walk(token_ids, extra_keys, digests).next_digest in inflight_digests

    def _walk(self, token_ids: Sequence[int], extra_keys: tuple, digests: Sequence[bytes] | None = None,
              after: TreeNode | None = None) -> TreeWalk:
        extra, extra_keys, bs = encode_extra_keys(extra_keys), tuple(extra_keys), self.block_size
        node = after if after is not None and after.attached and after.depth * bs <= len(token_ids) else self._root
        path: list[TreeNode] = []
        for i, start in enumerate(range(node.depth * bs, len(token_ids) - bs + 1, bs), node.depth):
            tokens = tuple(map(int, token_ids[start : start + bs]))
            digest = (digests[i] if digests is not None and i < len(digests)
                      else chained_digest(node.digest, tokens, extra))
            child = node.children.get(digest)
            if child is None or child.token_ids != tokens or child.extra_keys != extra_keys:
                return TreeWalk(path, digest, node)  # absent, or a digest collision: serve only what the tokens prove
            path.append(child)
            node = child
        return TreeWalk(path, None, node)

    def resume_walk(self, token_ids: Sequence[int], extra_keys: tuple, digests: Sequence[bytes] | None,
                    after: TreeNode | None) -> TreeWalk:
        """`peek`'s and `is_inflight`'s walk from `after` (an earlier walk's `end` for the same tokens) while it is in
        the tree: a waiting request re-read each step costs the blocks cached since, not its prefix again."""
        return self._walk(token_ids, extra_keys, digests, after)

    # -- insert ----------------------------------------------------------------------------------------
    def insert(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        extra_keys: tuple = (),
        *,
        priority: int = 0,
        epoch: int | None = None,
        known: int = 0,
    ) -> InsertResult:
        """Cache the full blocks of a sequence: `block_ids[i]` holds `token_ids[i*bs:(i+1)*bs]`.

        Only full blocks are inserted (`min(len(block_ids), len(token_ids) // block_size)` of them); the blocks
        must be in use. Where the tree already holds a prefix in another block (two requests computed it at
        once) the resident block is kept and the caller's is reported in `duplicate_block_ids` (it stays private
        to the caller). Inserting the same blocks again is a no-op apart from refreshing them.

        Pass `epoch=` the value of `self.epoch` when the request started computing: after a `reset()` (new
        weights) its blocks hold stale KV and the insert does nothing. `priority` feeds the "priority" policy.
        `known`: the caller's first `known` blocks were inserted before (a running request as its blocks fill): when
        the tree still holds exactly those blocks, the walk starts past them (`own_path`), not at the root.
        """
        if epoch is not None and epoch != self.epoch:
            return InsertResult(0, [], [])
        extra, extra_keys = encode_extra_keys(extra_keys), tuple(extra_keys)
        path = own_path(self._node_of_block, self._root, block_ids, known, extra_keys) if known else []
        node, bs, new_nodes, duplicates = path[-1] if path else self._root, self.block_size, list[TreeNode](), list[int]()
        try:  # on a misuse error, the blocks inserted so far stay valid and evictable
            for i in range(len(path), min(len(block_ids), len(token_ids) // bs)):
                tokens, block_id = tuple(map(int, token_ids[i * bs : (i + 1) * bs])), int(block_ids[i])
                child = self._node_of_block.get(block_id)
                if child and child.parent is node and child.token_ids == tokens and child.extra_keys == extra_keys:
                    path.append(child)  # inserted before (a running request as its blocks fill): no need to hash
                    node = child
                    continue
                digest = chained_digest(node.digest, tokens, extra)
                child = node.children.get(digest)
                if child is None:
                    child = self._add_node(node, tokens, block_id, digest, extra_keys)
                    new_nodes.append(child)
                elif child.token_ids != tokens or child.extra_keys != extra_keys:
                    break  # a digest collision: the resident entry stays, the rest of this sequence stays private
                elif child.block_id != block_id:
                    duplicates.append(block_id)
                path.append(child)
                node = child
        finally:
            self._touch(path, hit=False, priority=priority)
            for child in new_nodes:  # queued once their statistics are set, so their first key is current
                self._queue.push(child)
        if self.block_sink is not None and new_nodes:
            self.block_sink.blocks_stored(new_nodes)
        return InsertResult(len(new_nodes), [n.block_id for n in path], duplicates)

    def insert_tail(self, token_ids: Sequence[int], block_ids: Sequence[int], extra_keys: tuple = (), *,
                    epoch: int | None = None) -> bool:
        """Cache a sequence's last, partial block (its full ones cached by `insert` first) as a leaf that only
        `partial_block` finds: the next turn of a chat, or a program's next call, copies its start instead of
        recomputing it. Tails are the engine's own: routers' events, summaries and KV transfer see full blocks only.
        False when nothing was cached (no partial block, its parent block not in the tree, a tail cached already)."""
        bs, extra_keys, full = self.block_size, tuple(extra_keys), len(token_ids) // self.block_size
        tail = tuple(map(int, token_ids[full * bs :]))
        if (epoch is not None and epoch != self.epoch) or not tail or len(block_ids) <= full:
            return False
        parent = self._node_of_block.get(int(block_ids[full - 1])) if full else self._root  # the tree's block?
        last = tuple(map(int, token_ids[(full - 1) * bs : full * bs]))
        if parent is None or full and (parent.extra_keys != extra_keys or parent.token_ids != last):
            return False
        digest = chained_digest(parent.digest, tail, encode_extra_keys(extra_keys))
        if digest in parent.children or int(block_ids[full]) in self._node_of_block:
            return False
        # left untouched (last access 0, no value): a tail saves less than a block and costs a copy to reuse, so
        # it is the first block evicted, and lives only in room nothing else wants (+0-1.7 points of hit rate on
        # benchmarks/prefix_eviction.py's tight pools against touching it as a full block)
        self._queue.push(self._add_node(parent, tail, int(block_ids[full]), digest, extra_keys))
        return True

    def _add_node(self, parent: TreeNode, tokens: tuple[int, ...], block_id: int, digest: bytes,
                  extra_keys: tuple) -> TreeNode:
        """A new node under `parent` for an in-use block (the caller touches and queues it)."""
        check_insertable(self.pool, self._node_of_block, block_id)
        child = TreeNode(tokens, block_id, digest, parent, extra_keys, parent.depth + 1)
        parent.children[digest] = child
        self._node_of_block[block_id] = child
        self.pool.mark_cached(block_id)
        if self._valuer is not None:
            self._num_stored += 1
            remembered = self.ghosts.pop(digest) if self.ghosts is not None else None
            self._valuer.on_insert(child, remembered, self._churn())
        if self.events is not None and len(tokens) == self.block_size:
            self.events.record(BlockEventKind.STORED, digest)
        return child

    def _touch(self, path: list[TreeNode], *, hit: bool, priority: int = 0) -> None:
        # Whole root paths only: keeps parents ordered after their children for every built-in policy.
        self._clock = clock = self._clock + 1
        for node in path:  # (a running request's inserts touch its whole path: kept to plain stores and compares)
            node.last_access = clock
            node.hit_count += hit
            if node.priority < priority:  # noqa: PLR1730 -- a compare, not a call to max(), on a hot loop
                node.priority = priority
        if self._valuer is not None:
            self._valuer.revalue(path, hit=hit, now=self._churn(), inflation=self.inflation)

    def _churn(self) -> float:
        """Pool turnovers so far: blocks newly cached / blocks in the pool (the "cost" policy's clock)."""
        return self._num_stored / self.pool.num_blocks

    # -- pins (prefix_pins.py) ----------------------------------------------------------------------
    @property
    def num_pinned_blocks(self) -> int:
        return self._pins.num_blocks

    def pin(self, token_ids: Sequence[int], extra_keys: tuple = (), *, max_blocks: int) -> int:
        """Keep the cached full blocks of `token_ids` out of eviction until `unpin`; returns the tokens pinned (0
        when none is cached yet: run a request with the prefix first). Each pinned block holds one pool reference
        per pin; at most `max_blocks` distinct blocks pinned at once, beyond it `PrefixPinLimitError` and nothing
        changes. `reset()` drops every pin."""
        path = self._walk(token_ids, extra_keys).path
        if path:
            self._pins.pin(path, max_blocks=max_blocks)
        return len(path) * self.block_size

    def unpin(self, token_ids: Sequence[int], extra_keys: tuple = ()) -> int:
        """Undo one `pin` of the longest pinned prefix of `token_ids`; returns its tokens (0 if none is pinned)."""
        return self._pins.unpin(self._walk(token_ids, extra_keys).path) * self.block_size

    def pinned_ref_counts(self) -> dict[int, int]:
        """Pool references the pins hold, by block (the block manager adds them to its tables' counts)."""
        return self._pins.ref_counts(self._node_of_block.values())

    # -- eviction (the pool's Evictor protocol) ----------------------------------------------------------
    def evict(self, num_blocks: int) -> list[int]:
        """Drop `num_blocks` idle cached blocks, idle leaves first in policy order, and return their ids.

        Called by the pool, which uncaches the returned ids. Removing a leaf may make its parent an idle leaf,
        which then competes in the same order. Idle nodes with in-use descendants are not leaves; only if the
        leaves do not suffice (a request released blocks in the middle of its prefix) is such a node dropped
        with its subtree, whose in-use blocks then stop being cached but keep working.
        """
        refs, victims, interior = self.pool.ref_counts, list[int](), list[TreeNode]()
        self._queue.unpark(refs)  # blocks released since the last call compete again
        while len(victims) < num_blocks and (node := self._queue.pop()) is not None:
            if refs[node.block_id] > 0:
                self._queue.park(node)
            elif node.children:
                interior.append(node)
            else:
                self._detach(node)
                victims.append(node.block_id)
                parent = node.parent
                assert parent is not None  # only the root has none, and the root is never queued
                if parent is not self._root and not parent.children and refs[parent.block_id] == 0:
                    self._queue.push(parent)  # for custom policies that do not order parents after children
        interior.sort(key=self.policy.sort_key)
        for node in interior:
            if len(victims) < num_blocks and node.attached:
                victims.extend(self._drop_subtree(node))
            elif node.attached:
                self._queue.push(node)
        if len(self._queue) > 2 * len(self._node_of_block) + 64:  # stale duplicates from the parent pushes above
            self._queue.rebuild(self._node_of_block.values())
        self.num_evicted += len(victims)
        if self._departed:  # before the pool hands the blocks out again: their K/V are still there
            departed, self._departed = self._departed, []
            self.block_sink.blocks_evicted(departed)  # type: ignore[union-attr]
        return victims

    def _detach(self, node: TreeNode) -> None:
        assert node.parent is not None and node.digest is not None, "the root cannot be detached"
        del node.parent.children[node.digest]
        del self._node_of_block[node.block_id]
        node.attached = False
        self._queue.discard(node)
        if self._valuer is not None:
            self.inflation = max(self.inflation, node.value)
            if self.ghosts is not None:
                self.ghosts.record(node.digest, self._valuer.remember(node))
        full = len(node.token_ids) == self.block_size  # a tail (`insert_tail`) is the engine's own
        if self.events is not None and full:
            self.events.record(BlockEventKind.REMOVED, node.digest)
        if self.block_sink is not None and full:
            self._departed.append(node)

    def _drop_subtree(self, top: TreeNode) -> list[int]:
        """Remove `top` and its descendants; return the idle blocks; uncache the in-use ones (they keep working)."""
        idle, stack, order = [], [top], []
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        for node in reversed(order):  # children before parents
            self._detach(node)
            if self.pool.ref_counts[node.block_id] == 0:
                idle.append(node.block_id)
            else:
                self.pool.uncache(node.block_id)
        return idle

    def reset(self) -> int:
        """Forget every entry (the weights changed). In-use blocks keep working, uncached; idle ones become free.
        Bumps `epoch`, so inserts from requests that started before (stale KV) are refused. Returns the entries."""
        dropped = list(self._node_of_block.values())
        for node in dropped:
            node.attached = False
            self.pool.uncache(node.block_id)
        self._pins.release(dropped)  # the new weights make the pinned KV stale: pins end with the cache
        self._root.children.clear()
        self._node_of_block.clear()
        self._queue.clear()
        if self.ghosts is not None:
            self.ghosts.clear()
        self.epoch += 1
        if self.events is not None:
            self.events.record(BlockEventKind.CLEARED)
        return len(dropped)

    # -- invariants ------------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Assert tree <-> pool consistency, chained digests, block sizes and the eviction queue's coverage."""
        check_tree(self, chained_digest)
