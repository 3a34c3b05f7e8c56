"""The vocabulary as a byte trie in flat numpy arrays (`shared_trie.token_trie`: one per `TokenVocabulary`).

Nodes are numbered in DFS pre-order (children by byte value), so every subtree is a contiguous node range, and
the tokens are laid out in the same order ("positions"), so the tokens of a subtree are a contiguous slice:

    node:       0 (root)  1 'a'  2 'ab'  3 'abc'  4 'b'  ...
    positions:            [a]    [ab]    [abc]    [b]        pos_ptr[n] .. pos_ptr[n + 1]: tokens ending at n
    subtree(1) = nodes 1..3 = positions pos_ptr[1] .. sub_end[1]

Built without a Python loop over nodes: the sorted token strings' longest common prefixes give the nodes each
token adds (a string adds the nodes of its bytes past the common prefix with its predecessor), and parents,
subtree sizes and subtree byte sets come from one pass per depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hf_paged.processors.automaton.byte_dfa import byte_sets
from hf_paged.processors.automaton.utf8 import valid_utf8_suffixes

__all__ = ["TokenTrie", "bit_ints", "build_token_trie", "ranges_to_ids"]


@dataclass(slots=True)
class TokenTrie:
    """One vocabulary's trie (immutable, shared by every index over the vocabulary)."""

    node_byte: np.ndarray  # uint8 [num_nodes]: the byte leading into each node (root: 0, unused)
    child_ptr: np.ndarray  # int64 [num_nodes + 1]: children of n are child_ids[child_ptr[n]:child_ptr[n + 1]]
    child_ids: np.ndarray  # int64 [num_nodes - 1]
    child_bytes: np.ndarray  # uint8 [num_nodes - 1]: node_byte[child_ids] (the compiled walk reads it in order)
    pos_ptr: np.ndarray  # int64 [num_nodes + 1]: tokens ending at n are pos_ids[pos_ptr[n]:pos_ptr[n + 1]]
    sub_end: np.ndarray  # int64 [num_nodes]: tokens of the subtree of n are pos_ids[pos_ptr[n]:sub_end[n]]
    pos_ids: np.ndarray  # int64 [num_tokens]: token ids in DFS order
    sub_bytes: np.ndarray  # uint64 [num_nodes, 4]: bytes occurring strictly below n (256-bit set)
    node_depth: np.ndarray  # int64 [num_nodes]: bytes from the root
    pos_len: np.ndarray  # int64 [num_tokens]: each position's token length in bytes
    # the same facts as Python objects, for the per-node walk of narrow states (a numpy call costs ~1 us; a dict
    # lookup ~50 ns: when a state allows only a few bytes, walking node by node in Python is the cheaper way)
    depth: list[int]  # node -> length of its byte string
    pos_bytes: list[bytes]  # position -> its token's bytes (finishing small subtrees token by token)
    child_of: dict[int, int]  # (node << 8) | byte -> child node
    pos_start: list[int]  # = pos_ptr, as a list
    pos_id_list: list[int]  # = pos_ids, as a list
    pos_end: list[int]  # = sub_end, as a list
    sub_set: list[int]  # = sub_bytes as 256-bit Python ints
    token_bytes: list[bytes | None]  # id -> its bytes (None: not a regular token: special, EOS, padding)
    # per position (token in DFS order), for `string_tokens`: its ASCII bytes (2 x uint64), whether it has a byte
    # >= 0x80, its characters (bytes that are not UTF-8 continuations), whether it is well-formed UTF-8
    pos_ascii: np.ndarray
    pos_high: np.ndarray
    pos_chars: np.ndarray
    pos_utf8: np.ndarray
    # the same for the bytes past the first one, and the first byte itself
    pos_first: np.ndarray
    pos_ascii_1: np.ndarray
    pos_high_1: np.ndarray
    pos_chars_1: np.ndarray
    pos_utf8_1: np.ndarray
    # per first byte b, the bitmask words of the tokens starting with b (`string_masks`: first-byte groups)
    first_words: np.ndarray  # int32 [256, num_words]
    # per byte b, how many tokens hold b (anywhere / past their first byte): a lower bound on a body's other tokens
    byte_tokens: np.ndarray  # int64 [256]
    byte_tokens_1: np.ndarray  # int64 [256]
    max_depth: int = 0  # bytes of the longest token (bounds the compiled walk's stack, `walk_kernel`)
    long_tokens: object | None = None  # `grammar_masks`: the tokens past the lookahead classes' reach, on first use
    bodies: dict = field(default_factory=dict)  # (ASCII set, multibyte, skip) -> BodyTokens (`string_tokens`)

    @property
    def num_nodes(self) -> int:
        return self.node_byte.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.pos_ids.shape[0]


def bit_ints(sets: np.ndarray) -> list[int]:
    """`[n, 4]` uint64 bit sets -> n Python ints (bit b = byte b)."""
    raw = np.ascontiguousarray(sets).view(np.uint8).reshape(sets.shape[0], 32)
    return [int.from_bytes(row, "little") for row in map(bytes, raw)]


def ranges_to_ids(trie: TokenTrie, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Token ids at the disjoint DFS position ranges [starts, ends) (subtrees, the tokens ending at nodes)."""
    lengths = ends - starts
    nonempty = lengths > 0
    starts, lengths = starts[nonempty], lengths[nonempty]
    total = int(lengths.sum())
    pos_ids = trie.pos_ids
    if total * 8 < pos_ids.shape[0]:  # few tokens: enumerate the positions
        offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        return pos_ids[np.arange(total) + offsets]
    # many: mark range boundaries and prefix-sum them (ranges are disjoint)
    delta = np.zeros(pos_ids.shape[0] + 1, dtype=np.int32)
    delta[starts] += 1  # disjoint non-empty ranges: starts are distinct, and so are ends (no `np.add.at`)
    delta[starts + lengths] -= 1
    return pos_ids[np.cumsum(delta[:-1]) > 0]


def build_token_trie(tokens: dict[bytes, tuple[int, ...]], vocab_size: int) -> TokenTrie:
    """Build the trie of `tokens` (bytes -> ids; empty strings are ignored)."""
    keys = sorted(k for k in tokens if k)
    n = len(keys)
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=n)
    width = int(lengths.max()) if n else 1
    # padded byte matrix [n, width]: row i holds keys[i]
    flat = np.frombuffer(b"".join(keys), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    rows = np.repeat(np.arange(n), lengths)
    matrix = np.zeros((n, width), dtype=np.uint8)
    matrix[rows, np.arange(flat.shape[0]) - np.repeat(starts, lengths)] = flat
    # longest common prefix with the previous key (sorted, unique: always shorter than the key itself)
    lcp = np.zeros(n, dtype=np.int64)
    if n > 1:
        differs = matrix[1:] != matrix[:-1]
        first = np.where(differs.any(axis=1), differs.argmax(axis=1), width)
        lcp[1:] = np.minimum(first, np.minimum(lengths[1:], lengths[:-1]))
    added = lengths - lcp  # nodes each key adds: its prefixes of length lcp+1 .. len
    num_nodes = 1 + int(added.sum())
    owner = np.repeat(np.arange(n), added)
    first_node = 1 + np.cumsum(added) - added
    depth = np.zeros(num_nodes, dtype=np.int64)
    depth[1:] = np.repeat(lcp, added) + 1 + (np.arange(num_nodes - 1) + 1 - np.repeat(first_node, added))
    node_byte = np.zeros(num_nodes, dtype=np.uint8)
    node_byte[1:] = matrix[owner, depth[1:] - 1]
    # parent: the previous node, except for a key's first node, whose parent is the last node before it at
    # depth lcp (the end of the shared prefix) or the root
    parent = np.arange(num_nodes, dtype=np.int64) - 1
    parent[0] = -1
    heads = first_node[lcp > 0]
    head_depth = lcp[lcp > 0]
    for d in np.unique(head_depth):
        at_depth = np.flatnonzero(depth == d)
        queries = heads[head_depth == d]
        parent[queries] = at_depth[np.searchsorted(at_depth, queries) - 1]
    parent[first_node[lcp == 0]] = 0
    # subtree sizes and byte sets, deepest level first
    size = np.ones(num_nodes, dtype=np.int64)
    own_bit = byte_sets(np.eye(256, dtype=bool)[node_byte])
    sub_bytes = np.zeros((num_nodes, 4), dtype=np.uint64)
    levels = [np.flatnonzero(depth == d) for d in range(int(depth.max()) + 1)]
    for level in reversed(levels[1:]):
        np.add.at(size, parent[level], size[level])
        np.bitwise_or.at(sub_bytes, parent[level], sub_bytes[level] | own_bit[level])
    # from the root to each node: its bytes, and its characters (bytes that are not UTF-8 continuations)
    chars = np.zeros(num_nodes, dtype=np.int64)
    path_bytes = own_bit.copy()
    path_bytes[0] = 0  # the root has no byte (its `node_byte` 0 is a placeholder)
    for level in levels[1:]:
        chars[level] = chars[parent[level]] + ((node_byte[level] < 0x80) | (node_byte[level] >= 0xC0))
        path_bytes[level] |= path_bytes[parent[level]]
    path_1 = np.zeros_like(path_bytes)  # the bytes past the first one (for `TrieWalk`'s first-byte dispatch)
    for level in levels[2:]:
        path_1[level] = path_1[parent[level]] | own_bit[level]
    # children CSR (stable: children stay in DFS order, i.e. by byte)
    child_ids = np.argsort(parent[1:], kind="stable") + 1
    child_ptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent[1:], minlength=num_nodes), out=child_ptr[1:])
    # token positions: a key's ids sit at its last node
    own = np.zeros(num_nodes, dtype=np.int64)
    key_node = first_node + added - 1
    own[key_node] = [len(tokens[k]) for k in keys]
    pos_ptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(own, out=pos_ptr[1:])
    pos_ids = np.fromiter((i for k in keys for i in tokens[k]), dtype=np.int64, count=int(own.sum()))
    token_bytes: list[bytes | None] = [None] * vocab_size
    for key in keys:
        for token_id in tokens[key]:
            token_bytes[token_id] = key
    per_key = [len(tokens[k]) for k in keys]
    pos_node = np.repeat(key_node, per_key)
    pos_path, pos_path_1 = path_bytes[pos_node], path_1[pos_node]
    pos_first = np.repeat(np.fromiter((k[0] for k in keys), dtype=np.uint8, count=n), per_key)
    first_chars = ((pos_first < 0x80) | (pos_first >= 0xC0)).astype(np.int64)
    first_words = np.zeros((256, (vocab_size + 31) // 32), dtype=np.uint32)
    np.bitwise_or.at(first_words, (pos_first, pos_ids >> 5), np.left_shift(1, pos_ids & 31).astype(np.uint32))

    def per_byte(sets: np.ndarray) -> np.ndarray:  # [n, 4] uint64 bit sets -> tokens holding each byte
        bits = np.unpackbits(np.ascontiguousarray(sets).view(np.uint8).reshape(-1, 32), axis=1, bitorder="little")
        return bits.sum(axis=0, dtype=np.int64)

    return TokenTrie(
        node_byte=node_byte,
        child_ptr=child_ptr,
        child_ids=child_ids.astype(np.int64),
        child_bytes=node_byte[child_ids],
        pos_ptr=pos_ptr,
        sub_end=pos_ptr[np.arange(num_nodes) + size],
        pos_ids=pos_ids,
        sub_bytes=sub_bytes,
        node_depth=depth,
        pos_len=depth[pos_node],
        depth=depth.tolist(),
        pos_bytes=[key for key in keys for _ in tokens[key]],
        child_of=dict(zip(((parent[1:] << 8) | node_byte[1:]).tolist(), range(1, num_nodes))),
        pos_start=pos_ptr.tolist(),
        pos_id_list=pos_ids.tolist(),
        pos_end=pos_ptr[np.arange(num_nodes) + size].tolist(),
        sub_set=bit_ints(sub_bytes),
        token_bytes=token_bytes,
        pos_ascii=np.ascontiguousarray(pos_path[:, :2]),
        pos_high=(pos_path[:, 2] | pos_path[:, 3]) != 0,
        pos_chars=chars[pos_node],
        pos_utf8=np.repeat(np.array([k.isascii() or valid_utf8_suffixes(k)[0] for k in keys], dtype=bool), per_key),
        pos_first=pos_first,
        pos_ascii_1=np.ascontiguousarray(pos_path_1[:, :2]),
        pos_high_1=(pos_path_1[:, 2] | pos_path_1[:, 3]) != 0,
        pos_chars_1=chars[pos_node] - first_chars,
        pos_utf8_1=np.repeat(np.array([k.isascii() or valid_utf8_suffixes(k)[1] for k in keys], dtype=bool), per_key),
        first_words=first_words.view(np.int32),
        byte_tokens=per_byte(pos_path),
        byte_tokens_1=per_byte(pos_path_1),
        max_depth=int(depth.max()),
    )
