"""A regex as a dense byte automaton: `transitions[state, byte] -> state`.

Our compiler (`automaton/`) builds it from the regex text, every unit of work counted against a
`CompileBudget`; patterns in syntax only Rust's parser reads right are built by outlines-core (an `Index` over a
256-token vocabulary, one token per byte, is exactly the byte-level DFA of the pattern). The token-level view is
computed lazily from this table (`token_index.py`).

    state ids 0..S-1 (breadth-first from the initial state 0), S = the dead state
    transitions  int32 [S + 1, 256]   row S is all S (dead stays dead)
    finals       bool  [S + 1]        EOS allowed here (the document may end)
    loops        uint64 [S + 1, 4]    256-bit set of the bytes b with transitions[s, b] == s
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from itertools import chain
from typing import Any, ClassVar

import numpy as np

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.errors import InvalidRegexError, SchemaTooComplexError, UnsatisfiableSchemaError
from hf_paged.processors.automaton import nfa_kernel
from hf_paged.processors.automaton.dfa import KERNEL_LIMIT, DenseDFA, FlatNFA, Subsets, determinize, flat_nfa, subsets
from hf_paged.processors.automaton.nfa import build_nfa
from hf_paged.processors.automaton.python_syntax import rust_only
from hf_paged.processors.automaton.syntax import parse
from hf_paged.processors.automaton.tree import Unsupported
from hf_paged.processors.budget import CompileBudget

__all__ = ["ByteDFA", "PendingDFA", "anchored", "automaton_work", "build_byte_dfa", "build_pending", "byte_sets",
           "compile_regex", "regex_nfa"]

_PROBE: Any = None
_MEMO: OrderedDict[str, ByteDFA] = OrderedDict()  # anchored regex -> automaton: validate + build compile once
_MEMO_SIZE = 128  # entries ...
_MEMO_BYTES = 256 << 20  # ... and bytes of tables kept, whichever is reached first
_memo_bytes = 0  # bytes of the tables in `_MEMO` (under `_LOCK`)
_FAILED: OrderedDict[tuple, tuple[int, str]] = OrderedDict()  # (regex, limits) -> (work, message) of a refused build
_SENTINEL, _SENTINEL_BYTE = "\\x01", 0x01
_BYTE_MODE = re.compile(r"\(\?([a-zA-Z]*)-([a-zA-Z]*)u([a-zA-Z]*)([:)])")  # a flag group turning Unicode off
_MULTI_LINE = re.compile(r"\(\?[a-zA-Z-]*m")  # a flag group that may turn multi-line anchors on
_LEADING_ANCHOR = re.compile(r"\A((?:\(\?[a-zA-Z-]*\))*)(?:\^|\\A)(?![*+?{])")  # flag groups, then ^ or \A
_ANCHOR_OPEN, _ANCHOR_CLOSE = "(?:", ")\\z"  # `anchored`
_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)


@dataclass(slots=True)
class ByteDFA:
    """The byte automaton of one anchored regex (immutable once built)."""

    transitions: np.ndarray  # int32 [num_states + 1, 256]; row `dead` maps every byte to `dead`
    initial: int  # start state (always 0)
    finals: np.ndarray  # bool [num_states + 1]
    loops: np.ndarray  # uint64 [num_states + 1, 4]: bytes that keep each state where it is
    work: int = 0  # what building it counted (`automaton_work`), charged again on every memoised use
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
    def from_arrays(cls, transitions: np.ndarray, initial: int, finals: np.ndarray, *, loops: bool = True) -> ByteDFA:
        """Rebuild from the saved arrays (the loop sets are derived; `loops=False`: left empty, [0, 4], for an owner
        that derives them itself, a grammar's rule on first need)."""
        transitions = np.ascontiguousarray(transitions, dtype=np.int32)
        if not loops:
            return cls(transitions, int(initial), np.asarray(finals, dtype=bool), np.zeros((0, 4), dtype=np.uint64))
        states = np.arange(transitions.shape[0], dtype=np.int32)[:, None]
        return cls(transitions, int(initial), np.asarray(finals, dtype=bool), byte_sets(transitions == states))


@dataclass(slots=True)
class PendingDFA:
    """An automaton built up to its table (`build_pending`): counted and checked like a `ByteDFA`, its dense table
    written on first need (`byte_dfa`). A grammar's rules: the compile needs every rule's count of work, the first
    mask only the rules it reaches."""

    subsets: Subsets
    work: int = 0  # as `ByteDFA.work`

    @property
    def num_states(self) -> int:
        """States of the subset construction (the table may trim some away)."""
        return self.subsets.num_states

    def byte_dfa(self) -> ByteDFA:
        """The automaton with its table written (its loop sets left empty: `ByteDFA.from_arrays(loops=False)`)."""
        dense = self.subsets.dense()
        return ByteDFA.from_arrays(dense.transitions, 0, dense.finals, loops=False)


def anchored(regex: str) -> str:
    """`regex` anchored at end of input, the form every automaton is compiled from (the key of the memo; the form
    outlines-core needs for the patterns it still builds: its `Index` otherwise decides "may this token end here"
    from a delayed match flag and drops every token that leads on from a state that is already a match)."""
    return f"{_ANCHOR_OPEN}{regex}{_ANCHOR_CLOSE}"


def compile_regex(regex: str, budget: CompileBudget) -> DenseDFA | None:
    """Our compiler: the byte DFA of `regex` matched against whole texts (initial state 0, dead state last), or
    None when it matches no text.

    Raises:
        Unsupported: syntax to leave to outlines-core. InvalidRegexError: look-around and the like.
        SchemaTooComplexError: over one of the budget's limits.
    """
    return determinize(regex_nfa(regex, budget), budget)


def regex_nfa(regex: str, budget: CompileBudget) -> FlatNFA:
    """The NFA of `regex`: the compiled reader and builder (`nfa_kernel`) when it is loaded and reads the pattern,
    else the Python ones (`syntax.parse`, `nfa.build_nfa`); both build the same states and count the same work."""
    left = min(budget.left("nfa_states"), KERNEL_LIMIT)  # (a larger limit than int64 holds: never reached anyway)
    status, positions, start, *arrays = nfa_kernel.regex_nfa(nfa_kernel.codes_of(regex), left)
    if status == nfa_kernel.GIVE_UP:
        return flat_nfa(build_nfa(parse(regex), budget))
    budget.spend("nfa_states", positions)  # (OVER: raises, with the count the Python builder raises at)
    return FlatNFA(*arrays, start=start)


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


def build_byte_dfa(anchored_regex: str, *, fresh: bool = False, budget: CompileBudget | None = None) -> ByteDFA:
    """Compile `anchored_regex` (already wrapped by `anchored`) into a `ByteDFA`; memoised (small LRU).

    Our compiler (`compile_regex`) builds it, counting its work against `budget` (default: a fresh `CompileBudget`);
    syntax that only Rust's parser reads right (`\\p{..}`, nested classes, ...) is built by outlines-core, after
    the caller's size check (`build.check_regex_size`). `fresh=True` builds it even when memoised
    (benchmarks time the build).

    Raises:
        InvalidRegexError: the pattern does not parse, or uses look-around / back-references.
        UnsatisfiableSchemaError: it matches no text.
        SchemaTooComplexError: its automaton is over a limit of `budget`.
    """
    budget = budget if budget is not None else CompileBudget()
    with _LOCK:
        hit = None if fresh else _MEMO.get(anchored_regex)
        if hit is not None:
            _MEMO.move_to_end(anchored_regex)
    if hit is not None:
        budget.spend("work", hit.work)
        return hit
    dfa = _build(anchored_regex, budget, fresh, pending=False)
    assert isinstance(dfa, ByteDFA)
    _remember(anchored_regex, dfa)
    budget.spend("work", dfa.work)
    return dfa


def build_pending(anchored_regex: str, budget: CompileBudget) -> ByteDFA | PendingDFA:
    """`build_byte_dfa` built afresh for an owner that memoises it itself (a grammar's rules, `grammar_rules`): kept
    out of the memo, its table written on first need (`PendingDFA`; a pattern outlines-core builds comes whole),
    its loop sets left empty. The same counts, errors and work charged as `build_byte_dfa`."""
    dfa = _build(anchored_regex, budget, False, pending=True)
    budget.spend("work", dfa.work)
    return dfa


def _build(anchored_regex: str, budget: CompileBudget, fresh: bool, pending: bool) -> ByteDFA | PendingDFA:
    """The build of `build_byte_dfa` / `build_pending`, its work in `.work` (not charged yet); a refusal memoised
    per limits (`_FAILED`: the same error, its work charged again)."""
    limits = (anchored_regex, budget.max_nfa_states, budget.max_dfa_states, budget.max_dfa_steps)
    with _LOCK:
        failed = None if fresh else _FAILED.get(limits)
    if failed is not None:  # over a limit before, with these limits: the same error, the same work charged
        budget.work += failed[0]
        raise SchemaTooComplexError(failed[1])
    inner = anchored_regex[len(_ANCHOR_OPEN) : -len(_ANCHOR_CLOSE)] if _is_anchored(anchored_regex) else None
    meter = budget.for_automaton()  # the automaton's own limits: the same outcome whoever asks, memoised or not
    dfa: ByteDFA | PendingDFA
    try:
        if inner is None:
            raise Unsupported("not in the anchored form")
        if pending:
            found = subsets(regex_nfa(inner, meter), meter)
            if found is None:
                raise UnsatisfiableSchemaError(f"the regex {inner[:200]!r} matches no text; check the schema/regex")
            dfa = PendingDFA(found)
        else:
            dense = compile_regex(inner, meter)
            if dense is None:
                raise UnsatisfiableSchemaError(f"the regex {inner[:200]!r} matches no text; check the schema/regex")
            dfa = ByteDFA.from_arrays(dense.transitions, 0, dense.finals)
    except Unsupported:
        dfa = _outlines_byte_dfa(anchored_regex, loops=not pending)
    except SchemaTooComplexError as exc:
        work = automaton_work(len(anchored_regex), meter)
        with _LOCK:
            _FAILED[limits] = (work, str(exc))
            while len(_FAILED) > _MEMO_SIZE:
                _FAILED.popitem(last=False)
        budget.work += work  # (what the failed try did counts too; the error to report is this one)
        raise
    dfa.work = automaton_work(len(anchored_regex), meter)
    return dfa


def _remember(anchored_regex: str, dfa: ByteDFA) -> None:
    """Keep `dfa` in the memo, dropping the least recently used past its entries or bytes (a running total: summing
    every table on each insert cost more than small automata take to build)."""
    global _memo_bytes
    with _LOCK:
        old = _MEMO.pop(anchored_regex, None)
        _memo_bytes = 0 if not _MEMO else _memo_bytes - (0 if old is None else old.transitions.nbytes)  # (cleared)
        _MEMO[anchored_regex] = dfa
        _memo_bytes += dfa.transitions.nbytes
        while len(_MEMO) > _MEMO_SIZE or (len(_MEMO) > 1 and _memo_bytes > _MEMO_BYTES):
            _memo_bytes -= _MEMO.popitem(last=False)[1].transitions.nbytes


def automaton_work(num_chars: int, meter: CompileBudget) -> int:
    """What building one automaton costs, in `CompileBudget.work` units (~1 us of CPU each with the compiled subset
    construction on a 2.4 GHz EPYC, fitted on MaskBench's regexes and hostile ones): a fixed part (its arrays),
    parsing, NFA positions (built in Python: the compiled builder is faster, but a count must not depend on which
    one ran), DFA states and subset-construction steps."""
    return 500 + num_chars // 2 + 3 * meter.nfa_states + 2 * meter.dfa_states + meter.dfa_steps // 10


def _is_anchored(regex: str) -> bool:
    return regex.startswith(_ANCHOR_OPEN) and regex.endswith(_ANCHOR_CLOSE)


def _why_not(pattern: str, exc: Exception) -> str:
    """What is wrong with a pattern outlines-core refused, in the pattern's own terms (its messages name our
    wrapping of it, or a state number)."""
    if re.search(r"(?<!\\)\\[bB]", pattern):
        return "word boundaries (\\b, \\B) have no automaton here; remove them, or write (?-u:\\b) for ASCII ones"
    if re.search(r"(?<!\\)\\[Az]", pattern):
        return "\\A and \\z anchor nothing here: the whole text must match already; remove them"
    if rust_only(pattern) is None and not _BYTE_MODE.search(pattern):  # (Python's parser misreads, and warns
        # about, Rust-only syntax)
        try:
            re.compile(pattern)
        except re.error as error:  # Python's reading names the place (an unbalanced group, a bad repeat)
            return f"{error.msg} at position {error.pos}"
    return str(exc)[:300]


def _unicode_on(flags: re.Match) -> str:
    """A `_BYTE_MODE` flag group without its `-u`."""
    on, off = flags.group(1), flags.group(2) + flags.group(3)
    group = on + ("-" + off if off else "")
    return f"(?{group}{flags.group(4)}" if group else "(?:" if flags.group(4) == ":" else ""


def _builds(pattern: str) -> bool:
    """Whether outlines-core builds `pattern` (a variant of a refused one, to tell the user what was wrong)."""
    from outlines_core import Index

    try:
        Index(_SENTINEL + anchored(pattern), _probe_vocabulary())
    except ValueError:
        return False
    return True


def _comment_safe(anchored_regex: str) -> str:
    """`anchored_regex` without a leading start anchor, and with its closing written so that a verbose-mode comment
    at the pattern's end cannot swallow it: in `(?:(?x)a # c)\\z`, Rust reads `)\\z` as part of the comment (it runs
    to the end of the line). `(?x)\\n` before the closing ends any such comment and is nothing otherwise (inside a
    comment the flag group is comment text and the newline ends the comment; outside one the flag group sets
    verbose mode, which skips the newline, for the rest of our own group only)."""
    if not _is_anchored(anchored_regex):
        return anchored_regex
    # a start anchor that leads the pattern (after flag groups) is at the text's start, true there, and outlines-core
    # cannot build one ("anchored universal start state doesn't exist"): `(?i)^(yes|no)$` was refused
    inner = _LEADING_ANCHOR.sub(r"\1", anchored_regex[len(_ANCHOR_OPEN) : -len(_ANCHOR_CLOSE)], count=1)
    return _ANCHOR_OPEN + inner + ("(?x)\n" if "#" in inner else "") + _ANCHOR_CLOSE


def _outlines_byte_dfa(anchored_regex: str, loops: bool = True) -> ByteDFA:
    """outlines-core's byte automaton of a pattern our parser leaves to it (no work budget: its build cannot be
    interrupted, only the caller's size estimate guards it)."""
    from outlines_core import Index

    # A sentinel byte in front: `\x01` never occurs in JSON text, so the automaton after it is the pattern's own.
    # Without it outlines-core spends most of the build near the start state on some patterns (measured: a free
    # JSON value nested two deep 0.92 s -> 0.016 s, an array of them 5.3 s -> 0.026 s; the same DFA). (A start
    # anchor inside the pattern then never matches; outlines-core cannot build one without the sentinel either.)
    # A multi-line `^` matches after a newline: with `\n` as the sentinel it matches at the text's start too, as it
    # should (`(?m)^a$` was refused as matching nothing); `\b` reads both sentinels as the non-word start of text.
    sentinel, sentinel_byte = ("\\n", 0x0A) if _MULTI_LINE.search(anchored_regex) else (_SENTINEL, _SENTINEL_BYTE)
    try:
        index = Index(sentinel + _comment_safe(anchored_regex), _probe_vocabulary())
    except ValueError as exc:  # (outlines-core raises plain ValueErrors: a pattern it cannot read or build)
        pattern = anchored_regex[len(_ANCHOR_OPEN):-len(_ANCHOR_CLOSE)] if _is_anchored(anchored_regex) else \
            anchored_regex
        if _BYTE_MODE.search(pattern) and _builds(_BYTE_MODE.sub(_unicode_on, pattern)):
            raise InvalidRegexError(
                f"the regex {pattern[:200]!r} uses byte mode (?-u) where it matches bytes that are not UTF-8 "
                "(`(?-u:.)`, `(?-u:\\xFF)`, ...): a constraint holds text, so byte mode is supported only where it "
                "matches UTF-8 text, as in Rust's `regex::Regex`, which refuses these too; drop the -u, or write the "
                "ASCII class you mean, e.g. (?-u:[\\x00-\\x7F])") from None
        if "Found no transitions from state" in str(exc) and not re.search(r"(?<!\\)\\[bBAz]", pattern):
            # (every byte a token: a state that leads nowhere; an anchor or a boundary that never holds is named below)
            raise UnsatisfiableSchemaError(
                f"the regex {pattern[:200]!r} matches no text, or has a part that matches none (an empty class such "
                "as [a&&b]), which outlines-core, the builder of its Rust-only syntax, cannot build; remove that "
                "part") from None
        raise InvalidRegexError(f"the regex {pattern[:200]!r} does not compile: {_why_not(pattern, exc)}; use Rust "
                                "`regex` syntax (no look-around, no back-references)") from None
    table = index.get_transitions()  # {state: {byte (or 256 = EOS): next}}
    entry = index.get_initial_state()
    initial = table.get(entry, {}).get(sentinel_byte)
    if initial is None:
        raise UnsatisfiableSchemaError(f"the regex {anchored_regex[:200]!r} matches no text; check the schema/regex")
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
    return ByteDFA.from_arrays(transitions, 0, finals, loops=loops)
