"""A byte automaton cut to the bytes a vocabulary can write: no state whose only ways on need a missing byte.

A token is allowed when its bytes keep the automaton out of its dead state (`token_index`). With a vocabulary
that has every byte as a token (byte-level BPE, SentencePiece with byte fallback) each live state can be finished
token by token. One without byte fallback (a T5-like Unigram, WordPiece) may lack a byte altogether, e.g. `\\`:
then `"a` is live for the JSON enum `["a\\"b"]`, yet nothing can follow it, and a sequence that takes `a` is
stuck (the processors end such a document with an error, `base.GuidedLogitsProcessor`). Cutting the transitions
on the bytes no token holds and sending the states that can no longer reach a final state to the dead state
refuses `a` there instead, and loses no text the vocabulary could spell.

    transitions --(columns of missing bytes -> dead)--> live = reverse reach of the finals --> the rest -> dead

A byte can also be missing in context (held only inside tokens that never fit the automaton): such dead ends are
left to the processors' error. A grammar automaton builds its rows as decoding goes, so it is not cut.
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton.byte_dfa import ByteDFA
from hf_paged.processors.index.vocabulary import TokenVocabulary

__all__ = ["missing_bytes", "spellable_only", "token_alphabet"]


def token_alphabet(vocab: TokenVocabulary) -> np.ndarray:
    """bool [256]: the bytes some regular token holds."""
    present = np.zeros(256, dtype=bool)
    singles = [bytes([b]) in vocab.tokens for b in range(256)]  # 256 lookups: once per compile, not a vocab walk
    if all(singles):  # every byte a token of its own: the usual case (byte-level BPE, byte fallback)
        present[:] = True
        return present
    present[np.frombuffer(b"".join(vocab.tokens), dtype=np.uint8)] = True
    return present


def spellable_only(dfa: ByteDFA, vocab: TokenVocabulary) -> ByteDFA:
    """`dfa` itself when the vocabulary holds every byte, else a copy with the transitions on missing bytes, and
    into states that can then no longer reach a final state, sent to the dead state."""
    present = token_alphabet(vocab)
    if present.all():
        return dfa
    num_rows, dead = dfa.transitions.shape[0], dfa.dead
    cut = dfa.transitions.copy()
    cut[:, ~present] = dead
    # reverse reach from the finals over the remaining edges, grouped by target state
    targets = cut[:, present].astype(np.int64)
    edges = np.unique(targets * num_rows + np.arange(num_rows, dtype=np.int64)[:, None])
    edge_targets, edge_sources = edges // num_rows, edges % num_rows
    starts = np.searchsorted(edge_targets, np.arange(num_rows + 1))
    live = np.asarray(dfa.finals, dtype=bool).copy()
    live[dead] = False
    stack = np.flatnonzero(live).tolist()
    while stack:
        target = stack.pop()
        for source in edge_sources[starts[target] : starts[target + 1]].tolist():
            if not live[source]:
                live[source] = True
                stack.append(source)
    cut[~live[cut]] = dead
    cut[~live] = dead
    if np.array_equal(cut, dfa.transitions):  # the missing bytes led nowhere live anyway
        return dfa
    spelled = ByteDFA.from_arrays(cut, dfa.initial, dfa.finals)
    spelled.work = dfa.work
    return spelled


def missing_bytes(dfa: ByteDFA, vocab: TokenVocabulary, limit: int = 8) -> str:
    """The bytes the vocabulary lacks that `dfa`'s rows lead on by (its live part, before any cut), for errors:
    e.g. `"'=' (0x3d), '\\\\' (0x5c)"`; empty when none is missing."""
    present = token_alphabet(vocab)
    if present.all():
        return ""
    used = (dfa.transitions[:-1] != dfa.dead).any(axis=0)
    missing = np.flatnonzero(used & ~present).tolist()
    if not missing:
        return ""
    named = [f"{chr(b)!r} (0x{b:02x})" if 0x20 <= b < 0x7F else f"0x{b:02x}" for b in missing[:limit]]
    return ", ".join(named) + (f" and {len(missing) - limit} more bytes" if len(missing) > limit else "")
