"""The compiled inner loop of the vocabulary-trie walk (numba): which tokens under some (trie node, automaton
state) pairs keep the automaton alive.

    pop (node, state)
      state's row not available (`known[state]` false)  -> hand the pair back (the caller builds rows, calls again)
      every byte below node loops on state               -> the whole subtree's positions, no descent
      else                                               -> the positions of tokens ending at node, and push
                                                            (child, table[state, child's byte]) for live children

A position is a token's place in the trie's DFS order (`token_trie`): a subtree is a contiguous slice of them.
The walk is depth-first with an explicit stack, ~10 ns a node: the whole GPT-2 trie (98k nodes) in about 1 ms,
where the numpy level-by-level walk it replaces paid ~15 array calls a level (1-7 ms on wide states).

`walk_marked` is the same walk from the root, then the found tokens' bits set in a bitmask (a narrow state's
whole first visit in two calls); `walk_tokens` walks listed tokens one by one until a stop (a string body's few
hundred tokens holding a quote or a backslash, the tokens longer than the lookahead classes reach).

The loops are `jit.kernel`s: their Python bodies run until numba's compiled versions are loaded in the
background (`jit.start`), so no caller ever waits for a compile.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from hf_paged.processors.jit import kernel, warm_up

__all__ = ["PairWalk", "TokenWalk", "pack_tokens", "walk_marked", "walk_pairs", "walk_tokens"]


_LOCAL = threading.local()  # per thread: output buffers of the walk (`_scratch`)
_ROOT = np.zeros(1, dtype=np.int64)  # the trie's root node, the one starting node of `walk_marked`


@dataclass(slots=True)
class PairWalk:
    """What `walk_pairs` found."""

    positions: np.ndarray  # int64 DFS positions of the allowed tokens
    pending_nodes: np.ndarray  # int64 nodes met in a state not `known` (their own tokens not decided yet)...
    pending_states: np.ndarray  # int64 ... and that state


@dataclass(slots=True)
class TokenWalk:
    """What `walk_tokens` found, per token."""

    outcome: np.ndarray  # int8: 0 dead, 1 alive to its end, 2 stopped at a state not `inside`
    stop_depth: np.ndarray  # int64: the bytes read when stopped
    stop_state: np.ndarray  # int64: the state stopped at


@kernel
def _walk(nodes, states, table, known, dead, loops, has_loops, child_ptr, child_ids, child_bytes, pos_ptr, sub_end,
          sub_bytes, stack_size, positions, pending_nodes, pending_states):  # pragma: no cover (compiled)
    stack_nodes = np.empty(stack_size, np.int64)
    stack_states = np.empty(stack_size, np.int64)
    top = nodes.shape[0]
    stack_nodes[:top] = nodes
    stack_states[:top] = states
    num_positions = 0
    num_pending = 0
    while top > 0:
        top -= 1
        node = stack_nodes[top]
        state = stack_states[top]
        if not known[state]:
            pending_nodes[num_pending] = node
            pending_states[num_pending] = state
            num_pending += 1
            continue
        if has_loops[state]:
            below = sub_bytes[node]
            loop = loops[state]
            if ((below[0] & ~loop[0]) | (below[1] & ~loop[1]) | (below[2] & ~loop[2]) | (below[3] & ~loop[3])) == 0:
                for position in range(pos_ptr[node], sub_end[node]):
                    positions[num_positions] = position
                    num_positions += 1
                continue
        for position in range(pos_ptr[node], pos_ptr[node + 1]):
            positions[num_positions] = position
            num_positions += 1
        row = table[state]
        for c in range(child_ptr[node], child_ptr[node + 1]):
            following = row[child_bytes[c]]
            if following != dead:
                stack_nodes[top] = child_ids[c]
                stack_states[top] = following
                top += 1
    return num_positions, num_pending


@kernel
def _mark(positions, num_positions, pos_ids, words):  # pragma: no cover (compiled)
    for i in range(num_positions):  # the ids in place of their positions, and their bits
        token = pos_ids[positions[i]]
        positions[i] = token
        words[token >> 5] |= np.uint32(1) << np.uint32(token & 31)


@kernel
def _walk_tokens(state, table, inside, dead, flat, offsets, outcome, stop_depth, stop_state):  # pragma: no cover
    for i in range(offsets.shape[0] - 1):
        current = state
        outcome[i] = 1
        for j in range(offsets[i], offsets[i + 1]):
            current = table[current, flat[j]]
            if current == dead:
                outcome[i] = 0
                break
            if not inside[current]:
                outcome[i] = 2
                stop_depth[i] = j - offsets[i] + 1
                stop_state[i] = current
                break


def pack_tokens(raws: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Byte strings laid out for `walk_tokens`: their bytes one after the other (uint8, writable: the compiled
    walk's one signature) and where each starts (int64 [n + 1])."""
    offsets = np.zeros(len(raws) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, raws), dtype=np.int64, count=len(raws)), out=offsets[1:])
    return np.frombuffer(b"".join(raws), dtype=np.uint8).copy(), offsets


def walk_tokens(state: int, table: np.ndarray, inside: np.ndarray, dead: int, flat: np.ndarray,
                offsets: np.ndarray) -> TokenWalk:
    """Walk whole tokens (bytes `flat[offsets[i]:offsets[i + 1]]`) from `state` while they stay in `inside` states."""
    num_tokens = offsets.shape[0] - 1
    outcome = np.zeros(num_tokens, np.int8)
    stop_depth = np.zeros(num_tokens, np.int64)
    stop_state = np.zeros(num_tokens, np.int64)
    _walk_tokens(state, table, inside, dead, flat, offsets, outcome, stop_depth, stop_state)
    return TokenWalk(outcome, stop_depth, stop_state)


def walk_pairs(trie, nodes: np.ndarray, states: np.ndarray, table: np.ndarray, known: np.ndarray, dead: int,
               loops: np.ndarray, has_loops: np.ndarray) -> PairWalk:
    """Walk the trie below each (node, state) pair (distinct nodes, live states) with the automaton `table`.

    Args:
        trie: the vocabulary's `TokenTrie`.
        nodes, states: the starting pairs (int64), the node's bytes already read.
        table: int32 [S, 256] next state per byte; `dead` the dead state.
        known: bool [S]: the states whose row (and `loops` row) can be read; the others are handed back.
        loops: uint64 [S, 4]: the bytes that keep each state where it is; `has_loops` bool [S]: any of them.
    """
    positions, pending_nodes, pending_states = _scratch(trie)
    # depth-first: at most 256 children pushed per level of the deepest path, above the starting pairs
    stack_size = nodes.shape[0] + 256 * (trie.max_depth + 1)
    num_positions, num_pending = _walk(
        nodes.astype(np.int64, copy=False), states.astype(np.int64, copy=False), table, known, dead, loops, has_loops,
        trie.child_ptr, trie.child_ids, trie.child_bytes, trie.pos_ptr, trie.sub_end, trie.sub_bytes,
        stack_size, positions, pending_nodes, pending_states,
    )
    return PairWalk(positions[:num_positions].copy(), pending_nodes[:num_pending].copy(),
                    pending_states[:num_pending].copy())


def walk_marked(trie, state: int, table: np.ndarray, known: np.ndarray, dead: int, loops: np.ndarray,
                has_loops: np.ndarray, words: np.ndarray) -> PairWalk:
    """`walk_pairs` from the root in one state, the allowed tokens' bits set in `words` (uint32) as it goes; the
    walk's `positions` hold token ids. One compiled call from state to bitmask: a narrow state's first visit."""
    positions, pending_nodes, pending_states = _scratch(trie)
    num_ids, num_pending = _walk(
        _ROOT, np.array([state], dtype=np.int64), table, known, dead, loops, has_loops, trie.child_ptr,
        trie.child_ids, trie.child_bytes, trie.pos_ptr, trie.sub_end, trie.sub_bytes, 1 + 256 * (trie.max_depth + 1),
        positions, pending_nodes, pending_states,
    )
    _mark(positions, num_ids, trie.pos_ids, words)
    return PairWalk(positions[:num_ids].copy(), pending_nodes[:num_pending].copy(),
                    pending_states[:num_pending].copy())


def _scratch(trie) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's output buffers for walks of `trie` (every token, every node), reused: a narrow walk finds a few
    tokens, and three fresh vocabulary-sized arrays per walk cost more than the walk."""
    buffers = getattr(_LOCAL, "buffers", None)
    if buffers is None or buffers[0] is not trie:
        num_nodes = trie.node_byte.shape[0]
        buffers = _LOCAL.buffers = (trie, np.empty(trie.pos_ids.shape[0], np.int64), np.empty(num_nodes, np.int64),
                                    np.empty(num_nodes, np.int64))
    return buffers[1], buffers[2], buffers[3]


@warm_up
def _signatures() -> None:
    """One tiny call per kernel, in the types the walks pass (int32 tables, bool flags, uint64 loop sets)."""
    one = np.zeros(1, np.int64)
    empty = np.zeros((1, 4), np.uint64)
    _walk.dispatcher(one, one, np.zeros((1, 256), np.int32), np.ones(1, bool), -1, empty, np.zeros(1, bool),
                     np.zeros(2, np.int64), one, np.zeros(1, np.uint8), np.zeros(2, np.int64), one, empty, 1,
                     np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))
    _mark.dispatcher(np.zeros(1, np.int64), 0, one, np.zeros(1, np.uint32))
    _walk_tokens.dispatcher(0, np.zeros((1, 256), np.int32), np.ones(1, bool), -1, np.zeros(1, np.uint8),
                            np.zeros(2, np.int64), np.zeros(1, np.int8), np.zeros(1, np.int64),
                            np.zeros(1, np.int64))
