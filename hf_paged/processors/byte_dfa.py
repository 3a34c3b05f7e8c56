"""A regex as a dense byte automaton: `transitions[state, byte] -> state`, built by outlines-core in milliseconds.

outlines-core stays our regex compiler: an `Index` over a 256-token vocabulary (one token per byte) is exactly
the byte-level DFA of the pattern, and costs ~2 ms where the same pattern over a 50k-token vocabulary costs
100+ ms (every state scans every token). The token-level view is computed lazily from this table
(`token_index.py`).

    state ids 0..S-1 (outlines-core's ids remapped, initial state first), S = the dead state
    transitions  int32 [S + 1, 256]   row S is all S (dead stays dead)
    finals       bool  [S + 1]        EOS allowed here (the document may end)
    loops        uint64 [S + 1, 4]    256-bit set of the bytes b with transitions[s, b] == s
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from itertools import chain
from typing import Any, ClassVar

import numpy as np

__all__ = ["ByteDFA", "build_byte_dfa", "byte_sets"]

_PROBE: Any = None
_MEMO: OrderedDict[str, ByteDFA] = OrderedDict()  # anchored regex -> automaton: validate + build compile once
_MEMO_SIZE = 32
_SENTINEL, _SENTINEL_BYTE = "\\x01", 0x01
_LOCK = threading.Lock()


@dataclass(slots=True)
class ByteDFA:
    """The byte automaton of one anchored regex (immutable once built)."""

    transitions: np.ndarray  # int32 [num_states + 1, 256]; row `dead` maps every byte to `dead`
    initial: int  # start state (always 0)
    finals: np.ndarray  # bool [num_states + 1]
    loops: np.ndarray  # uint64 [num_states + 1, 4]: bytes that keep each state where it is
    lazy: ClassVar[bool] = False  # every row is built (a `GrammarDFA` builds rows on demand: `ensure`)

    @property
    def num_states(self) -> int:
        return self.transitions.shape[0] - 1

    @property
    def dead(self) -> int:
        return self.transitions.shape[0] - 1

    def accepts(self, data: bytes) -> bool:
        """Whether the automaton matches all of `data` (tests and benchmarks; the processors walk tokens)."""
        state = self.initial
        for byte in data:
            state = int(self.transitions[state, byte])
        return bool(self.finals[state])

    def ensure(self, states: np.ndarray) -> None:
        """Nothing to do: every row is built (`GrammarDFA.ensure` builds missing rows)."""

    def ensure_one(self, state: int) -> None:
        """Nothing to do: every row is built."""

    @classmethod
    def from_arrays(cls, transitions: np.ndarray, initial: int, finals: np.ndarray) -> ByteDFA:
        """Rebuild from the saved arrays (the loop sets are derived)."""
        transitions = np.ascontiguousarray(transitions, dtype=np.int32)
        states = np.arange(transitions.shape[0], dtype=np.int32)[:, None]
        return cls(transitions, int(initial), np.asarray(finals, dtype=bool), byte_sets(transitions == states))


def byte_sets(member: np.ndarray) -> np.ndarray:
    """bool `[n, 256]` -> `[n, 4]` uint64 bit sets (bit `b % 64` of word `b // 64` is byte `b`)."""
    packed = np.packbits(member.astype(bool, copy=False), axis=1, bitorder="little")  # [n, 32] uint8
    return np.ascontiguousarray(packed).view(np.uint64).reshape(member.shape[0], 4)


def _probe_vocabulary() -> Any:
    global _PROBE
    if _PROBE is None:
        from outlines_core import Vocabulary

        _PROBE = Vocabulary(256, {bytes([b]): [b] for b in range(256)})
    return _PROBE


def build_byte_dfa(anchored_regex: str, *, fresh: bool = False) -> ByteDFA:
    """Compile `anchored_regex` (already wrapped by `index_cache.anchored`) into a `ByteDFA`; memoised (small LRU).

    `fresh=True` builds it even when memoised (benchmarks time the build).

    Raises:
        ValueError: outlines-core's own error (the caller translates it into a typed error).
    """
    with _LOCK:
        hit = None if fresh else _MEMO.get(anchored_regex)
        if hit is not None:
            _MEMO.move_to_end(anchored_regex)
            return hit
    from outlines_core import Index

    # A sentinel byte in front: `\x01` never occurs in JSON text, so the automaton after it is the pattern's own.
    # Without it outlines-core spends most of the build near the start state on some patterns (measured: a free
    # JSON value nested two deep 0.92 s -> 0.016 s, an array of them 5.3 s -> 0.026 s; the same DFA).
    index = Index(_SENTINEL + anchored_regex, _probe_vocabulary())
    table = index.get_transitions()  # {state: {byte (or 256 = EOS): next}}
    entry = index.get_initial_state()
    initial = table.get(entry, {}).get(_SENTINEL_BYTE)
    if initial is None:
        raise ValueError("the regex matches no text")
    table = {state: edges for state, edges in table.items() if state != entry}  # nothing leads back to it
    # all edges as flat arrays (a few numpy calls per state instead of a Python step per edge)
    counts = np.fromiter((len(edges) for edges in table.values()), dtype=np.int64, count=len(table))
    total = int(counts.sum())
    src = np.repeat(np.fromiter(table.keys(), dtype=np.int64, count=len(table)), counts)
    byte = np.fromiter(chain.from_iterable(table.values()), dtype=np.int64, count=total)  # (no generator frames)
    dst = np.fromiter(chain.from_iterable(map(dict.values, table.values())), dtype=np.int64, count=total)
    # initial first, then the others in outlines-core's order: ids are dense and deterministic
    others = np.setdiff1d(np.union1d(src, dst), [initial])
    order = np.concatenate(([initial], others))
    dead = len(order)
    position = np.argsort(order, kind="stable")
    sorted_ids = order[position]

    def remap(ids: np.ndarray) -> np.ndarray:
        return position[np.searchsorted(sorted_ids, ids)]

    transitions = np.full((dead + 1, 256), dead, dtype=np.int32)
    keep = byte < 256  # 256 is the probe vocabulary's EOS
    transitions[remap(src[keep]), byte[keep]] = remap(dst[keep])
    finals = np.zeros(dead + 1, dtype=bool)
    final_ids = np.fromiter(index.get_final_states(), dtype=np.int64)
    finals[remap(final_ids)] = True
    dfa = ByteDFA.from_arrays(transitions, 0, finals)
    with _LOCK:
        _MEMO[anchored_regex] = dfa
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return dfa
