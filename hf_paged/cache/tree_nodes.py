"""The prefix tree's values: a node (one full block), where a query leaves the tree, and what a match or an insert
returns (`radix.py` builds and walks them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["BlockSink", "InsertResult", "PrefixMatch", "TreeNode", "TreeWalk", "longest_partial_child", "own_path"]


class BlockSink(Protocol):
    """Told of full blocks entering and leaving the tree (`RadixCache.block_sink`; the KV connector saves them out).
    Called while the blocks still hold their K/V: stored right after the forward that wrote them, evicted before
    the pool hands them out again. It must not call back into the tree or the pool."""

    def blocks_stored(self, nodes: Sequence[TreeNode]) -> None: ...

    def blocks_evicted(self, nodes: Sequence[TreeNode]) -> None: ...


@dataclass(slots=True)
class PrefixMatch:
    """The longest cached prefix of a query, in full blocks."""

    block_ids: list[int]  # pool blocks holding the prefix, in order; not yet referenced by the caller
    num_tokens: int  # tokens they cover: len(block_ids) * block_size


@dataclass(slots=True)
class InsertResult:
    """What an insert did to the tree."""

    num_new_blocks: int  # blocks that became cached by this call
    cached_block_ids: list[int]  # the tree's block for each inserted position (differs at duplicates)
    duplicate_block_ids: list[int] = field(default_factory=list)  # caller blocks not cached: another holds that prefix


@dataclass(slots=True)
class TreeWalk:
    """Where a query leaves the tree."""

    path: list[TreeNode]  # the cached blocks that equal the query's first full blocks (past `after`: `resume_walk`)
    next_digest: bytes | None  # digest of the query's first full block past them; None if there is none
    end: TreeNode | None = None  # the last node matched (the root when none): its depth counts the blocks matched


@dataclass(slots=True, eq=False)
class TreeNode:
    """One full block of the prefix tree (the root holds no block); what eviction policies read about it
    (`eviction_policy.EvictableNode`)."""

    token_ids: tuple[int, ...]
    block_id: int  # -1 for the root
    digest: bytes | None  # None for the root
    parent: TreeNode | None
    extra_keys: tuple
    depth: int  # root 0, first block 1
    children: dict[bytes, TreeNode] = field(default_factory=dict)  # by digest
    last_access: int = 0
    hit_count: int = 1  # its insert + every match that served it
    priority: int = 0
    version: int = 0  # bumped on every requeue: queue entries with an older version are stale
    attached: bool = True
    # "cost" policy only (eviction_policy.CostPolicy), untouched under the others:
    value: float = 0.0  # retention value stamped at the last touch; never below a child's
    reuse: float = 1.0  # decayed uses of this prefix (insert + hits) as of reuse_clock
    reuse_clock: float = 0.0  # churn clock (pool turnovers) when reuse was last counted
    pins: int = 0  # pins covering this block (`pin`): each holds one pool reference, so it is never evicted


def longest_partial_child(node: TreeNode, tokens: Sequence[int], extra_keys: tuple,
                          limit: int) -> tuple[TreeNode | None, int]:
    """The child of `node` whose block begins with the longest run of `tokens` (fewer than a block), and that
    run's length; (None, 0) when no child shares even the first token. At most `limit` children are compared (in
    insertion order), so a node with thousands of children costs a bounded amount of work per query."""
    best, best_len = None, 0
    for i, child in enumerate(node.children.values()):
        if i == limit:
            break
        if child.extra_keys != extra_keys or not tokens or child.token_ids[0] != tokens[0]:
            continue
        n = 0
        for a, b in zip(child.token_ids, tokens):
            if a != b:
                break
            n += 1
        if n > best_len:
            best, best_len = child, n
    return best, best_len


def own_path(node_of_block: dict[int, TreeNode], root: TreeNode, block_ids: Sequence[int], known: int,
             extra_keys: tuple) -> list[TreeNode]:
    """The root path of the caller's first `known` blocks when the tree holds exactly those blocks, one a level
    (each node's block is the caller's block at its depth), else []. Such a path holds the caller's tokens: each
    node was verified on its tokens when it was inserted or matched, and a node never changes its block or
    tokens. Costs pointer steps, not the hashes and token tuples of a walk from the root (which made a request's
    inserts, one per filled block, quadratic in its length: 2.4 ms an insert at 32k tokens)."""
    if known > len(block_ids):  # (a caller's count past its table: nothing to trust)
        return []
    node = node_of_block.get(int(block_ids[known - 1]))
    if node is None or node.depth != known or node.extra_keys != extra_keys:
        return []
    path = [node] * known
    for i in range(known - 1, -1, -1):
        if node is None or node.block_id != block_ids[i]:
            return []
        path[i], node = node, node.parent
    return path if node is root else []
