"""`check_tree`: the prefix tree's invariants (`RadixCache.check_integrity`), asserted over its internals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hf_paged.cache.digests import encode_extra_keys

__all__ = ["check_insertable", "check_tree"]


def check_tree(tree: Any, chained_digest: Callable[[bytes | None, tuple, bytes], bytes]) -> None:
    """`tree`: a `RadixCache` (not imported: radix.py imports this module). Tree <-> pool consistency, digests
    chained by the tree's own `chained_digest`, block sizes (full blocks; tails only as leaves), the orderings the
    eviction queue relies on, the queue's coverage, pins and ghosts."""
    pool, bs, seen = tree.pool, tree.block_size, 0
    stack = [tree._root]
    while stack:
        parent = stack.pop()
        for digest, node in parent.children.items():
            seen += 1
            assert node.attached and node.parent is parent, f"block {node.block_id}: wrong parent link"
            assert node.depth == parent.depth + 1, f"block {node.block_id}: depth {node.depth}"
            assert len(node.token_ids) == bs or (0 < len(node.token_ids) < bs and not node.children), (
                f"block {node.block_id} holds {len(node.token_ids)} tokens")  # a full block, or a tail leaf
            want = chained_digest(parent.digest, node.token_ids, encode_extra_keys(node.extra_keys))
            assert node.digest == digest == want, f"block {node.block_id}: digest does not chain"
            assert tree._node_of_block.get(node.block_id) is node, f"block {node.block_id} not indexed"
            assert pool.is_cached(node.block_id), f"block {node.block_id} in the tree but not cached in the pool"
            if parent is not tree._root:  # orderings the eviction queue relies on (see eviction_policy.py)
                assert parent.last_access >= node.last_access and parent.hit_count >= node.hit_count
                assert parent.priority >= node.priority, f"block {node.block_id}: priority above its parent's"
                assert parent.value >= node.value, f"block {node.block_id}: value above its parent's"
            stack.append(node)
    assert seen == len(tree._node_of_block), f"{len(tree._node_of_block)} indexed blocks, {seen} in the tree"
    assert pool.num_cached_blocks == seen, f"pool caches {pool.num_cached_blocks} blocks, the tree maps {seen}"
    stuck = tree._queue.unqueued(tree._node_of_block.values())
    tree._pins.check_integrity(tree._node_of_block.values(), tree._root)
    assert all(end.attached for end in tree._pins.ends), "a pin on a block the tree no longer holds"
    assert not stuck, f"blocks {[n.block_id for n in stuck]} are in no eviction queue: they can never be evicted"
    if tree.ghosts is not None:
        assert len(tree.ghosts) <= tree.ghosts.capacity, f"{len(tree.ghosts)} ghosts over {tree.ghosts.capacity}"
        live = [n.block_id for n in tree._node_of_block.values() if n.digest in tree.ghosts]
        assert not live, f"blocks {live} are cached and remembered as evicted at once"


def check_insertable(pool: Any, node_of_block: dict, block_id: int) -> None:
    """A block may become a tree node: in the pool's range, in use, not cached for another prefix already."""
    if not 0 <= block_id < pool.num_blocks:
        raise ValueError(f"block id {block_id} is out of range: the pool has blocks 0..{pool.num_blocks - 1}")
    if pool.ref_counts[block_id] == 0:
        raise ValueError(f"block {block_id} is not in use (ref_count 0): insert a request's blocks before freeing them")
    if block_id in node_of_block:
        raise ValueError(
            f"block {block_id} is already cached for another prefix; a block holds one prefix: pass the "
            "request's own block table with the tokens it was computed from (and the same extra_keys)"
        )
