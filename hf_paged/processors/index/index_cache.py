"""Compiled token indexes: an LRU keyed by (schema, regex or `Grammar`, whitespace, vocabulary fingerprint), an optional
on-disk copy, and background compilation.

A compiled index is a byte automaton (`automaton.build_automaton`: a regex's `ByteDFA` or a grammar's
`GrammarDFA`) plus the lazy token view over the vocabulary trie (`token_index.py`): masks are computed per state on
first visit, so a compile does not scan the vocabulary from every state. Its work is counted against a
`CompileBudget` (counts, never seconds: one constraint has one outcome on any machine under any load); the checks
before a build (`validate_regex`, `check_regex_size`) live with the automata.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from hf_paged.after_fork import call_after_fork, renew_locks_after_fork, settle
from hf_paged.errors import SchemaTooComplexError, UnsatisfiableSchemaError
from hf_paged.processors import jit
from hf_paged.processors.automaton import ByteDFA, Grammar, GrammarDFA, build_automaton, check_regex_size, describe
from hf_paged.processors.automaton.productive import never_ending_rules
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index.byte_lru import ByteLRU
from hf_paged.processors.index.index_files import read_automaton, trim_dir, write_automaton
from hf_paged.processors.index.shared_trie import token_trie
from hf_paged.processors.index.spellable import missing_bytes, spellable_only
from hf_paged.processors.index.token_index import StateMask, TokenIndex
from hf_paged.processors.index.vocabulary import TokenVocabulary

__all__ = ["CompiledIndex", "IndexCache", "default_index_cache", "index_key", "warm_up"]

logger = logging.getLogger(__name__)


# Masks precomputed for a new index, nearest the start first, counted in narrow-state units (a narrow state's mask,
# ~20 us, is one; a wide one counts `token_index.WIDE_UNITS`): the states right after the start. A count, not a
# clock: the same states are warm on any machine. 16, not 64 (measured on MaskBench: compile p50 -1 ms, mask p99
# unchanged): the further states are mostly narrow ones, ~20-40 us on their first visit, far below the masks that
# decide the p99 (string bodies and grammar states, which the automaton-wide facts `warm` computes first speed up).
# Computed in `IndexCache`'s background thread right after the index is published, not on the compile's path (half
# of a median SchemaStore schema's index time): the caller waits for the automaton and the initial mask only.
WARM_UNITS = 16
DEFAULT_MAX_BYTES = 512 << 20  # see `IndexCache.max_bytes`
MAX_BYTES_ENV = "HF_PAGED_INDEX_CACHE_MB"


def index_key(kind: str, text: str | Grammar, whitespace: str | None, fingerprint: str, *extra: Any) -> str:
    """A stable digest naming one compiled index (no salted `hash()`: it also names files on disk); a `Grammar`
    among the parts is keyed by its rule texts."""
    raw = json.dumps([kind, text, whitespace, fingerprint, *extra], ensure_ascii=False, default=_key_part)
    return hashlib.blake2b(raw.encode("utf-8"), digest_size=20).hexdigest()


def _key_part(part: Any) -> Any:
    """A part of `index_key` that JSON does not write: a grammar as its texts (never equal to a regex's string)."""
    return {"grammar": list(part.texts)} if isinstance(part, Grammar) else str(part)


@dataclass(slots=True)
class CompiledIndex:
    """An immutable compiled index, shared by every guide (request) that uses the same schema and vocabulary."""

    index: TokenIndex  # over anchored(regex); outlines-core's Index API, masks computed lazily
    regex: str | Grammar  # the un-anchored pattern, or the grammar
    vocab: TokenVocabulary
    compile_s: float  # wall time of the build (0.0 when loaded from disk)
    from_disk: bool = False

    def forced_token(self, state: int) -> int | None:
        """The single token allowed in `state` when nothing else (EOS included) is, else None. Memoised."""
        return self.index.forced_token(state)

    def mask(self, state: int) -> StateMask:
        """The mask of `state`, computed on its first visit and memoised (see `TokenIndex.state_mask`)."""
        return self.index.state_mask(state)

    def state_mask(self, state: int) -> StateMask | None:
        """The memoised mask of `state`, or None when no sequence has visited it yet."""
        return self.index.cached_mask(state)

    @property
    def num_bytes(self) -> int:
        """Bytes the index holds (`TokenIndex.num_bytes`: masks as they come, the rest as last measured)."""
        return self.index.num_bytes


def _compile(
    regex: str | Grammar, vocab: TokenVocabulary, dfa: ByteDFA | GrammarDFA | None = None, from_disk: bool = False,
    budget: CompileBudget | None = None,
) -> CompiledIndex:
    """Byte automaton + lazy token view. The initial state's mask is computed now (an empty one means no token
    sequence of this vocabulary can match, reported at compile time rather than at the first step); the next
    states' masks are `warm_up`'s, after the index is published."""
    start = time.perf_counter()  # (reported as `compile_s`, never a limit)
    if dfa is None:
        dfa = build_automaton(regex, budget)
    built = dfa
    if not dfa.lazy:  # a vocabulary without some byte: no state it could never leave (`spellable`)
        dfa = spellable_only(dfa, vocab)
    compiled = CompiledIndex(TokenIndex(dfa, vocab, token_trie(vocab)), regex, vocab, 0.0, from_disk)
    if compiled.mask(dfa.initial).num_allowed == 0:
        if isinstance(regex, Grammar) and 0 in (stuck := never_ending_rules(regex)):
            raise UnsatisfiableSchemaError(
                f"no document matches the constraint {describe(regex)}: its rules {stuck} only lead into each other "
                "and never end (a schema whose `$ref`s loop with no branch that stops, such as {\"$ref\": \"#\"}); "
                "give the recursion a way out (e.g. an anyOf with a non-recursive branch, or make the property "
                "optional)"
            )
        missing = missing_bytes(built, vocab) if not built.lazy else ""
        raise UnsatisfiableSchemaError(
            f"no token of this vocabulary can start a match of the constraint {describe(regex)}; check the "
            "schema/regex, or use a tokenizer whose tokens cover every character it needs"
            + (f" (no token of this one holds {missing})" if missing else "")
        )
    compiled.compile_s = 0.0 if from_disk else time.perf_counter() - start
    return compiled


class IndexCache:
    """LRU of `CompiledIndex`es with an optional directory of persisted indexes and a background compiler.

    Args:
        max_entries: indexes kept in memory (least recently used dropped first).
        max_bytes: most bytes of indexes kept in memory (`CompiledIndex.num_bytes`: the automaton, its per-state
            views, memoised masks; measured when an index is stored or hit, masks counted as decoding memoises them);
            past it, the least recently used go, never the newest. Default `DEFAULT_MAX_BYTES` (512 MiB: eight
            indexes grown to their mask cap, `token_index.MAX_CACHED_BYTES`; vLLM's default for xgrammar's cache);
            the process-wide cache reads `HF_PAGED_INDEX_CACHE_MB`. None: count-bounded only. An index a running
            request uses stays alive through the request's processor when the cache drops it.
        cache_dir: directory where compiled indexes are saved and looked up across processes; None: memory only.
        max_compile_s: None (default): wait for a build as long as it takes; its work budget (`CompileBudget`)
            bounds it, so a constraint compiles or is refused the same way on any machine. A number: give up
            waiting after that many seconds with `SchemaTooComplexError` (opt-in: the outcome then depends on the
            machine's load).
        max_regex_size: size estimate `validate_regex` refuses above (a cheap check before any automaton).
        max_workers: background compile threads.
        max_disk_bytes: most bytes of index files in `cache_dir` (default 1 GiB; None: no limit). Past it, the files
            least recently saved or loaded go (down to 80% of it, so a save rarely rescans the directory): a
            long-running process meeting a new schema per request must not fill the disk.

    Example:
        >>> cache = IndexCache(max_entries=8)
        >>> future = cache.compile_async(key, regex, vocab)     # doctest: +SKIP
        >>> compiled = future.result()                          # doctest: +SKIP
    """

    def __init__(
        self,
        max_entries: int = 64,
        *,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        cache_dir: str | os.PathLike | None = None,
        max_compile_s: float | None = None,
        max_regex_size: int = 200_000,
        max_workers: int = 2,
        max_disk_bytes: int | None = 1 << 30,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"IndexCache.max_entries must be >= 1, got {max_entries}")
        if max_compile_s is not None and max_compile_s <= 0:
            raise ValueError(f"IndexCache.max_compile_s must be > 0, got {max_compile_s}")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"IndexCache.max_bytes must be an int >= 1 or None, got {max_bytes!r}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.max_compile_s = max_compile_s
        self.max_regex_size = max_regex_size
        if max_disk_bytes is not None and max_disk_bytes < 1:
            raise ValueError(f"IndexCache.max_disk_bytes must be >= 1 or None, got {max_disk_bytes}")
        self.max_disk_bytes = max_disk_bytes
        self._disk_bytes: int | None = None  # bytes of index files in cache_dir, counted at the first save
        # key -> index, weighed by `CompiledIndex.num_bytes`; a dropped index stops reporting its growth here
        self._entries: ByteLRU[CompiledIndex] = ByteLRU(max_entries, max_bytes, on_drop=_stop_reporting)
        self._in_flight: dict[str, tuple[Future, tuple]] = {}  # key -> its build's future and arguments
        self._lock = threading.Lock()
        self._max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hf_paged-compile")
        _LIVE.add(self)
        self.num_hits = 0
        self.num_misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_bytes(self) -> int:
        """Bytes of the indexes held in memory (as measured at their last store or hit, plus masks since)."""
        return self._entries.num_bytes

    def get(self, key: str) -> CompiledIndex | None:
        """The cached index for `key` (memory, then disk), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self.num_hits += 1
        try:  # weigh it again off the caller's path (a walk over its arrays, up to ~0.1 s for a big grown grammar)
            self._executor.submit(self._weigh, key, entry)
        except RuntimeError:  # (the executor is shutting down)
            pass
        return entry

    def _weigh(self, key: str, entry: CompiledIndex) -> None:
        """Measure a hit's index (it grew since it was stored) and enforce the budget with its new weight."""
        size = entry.index.measure()
        with self._lock:
            if self._entries.peek(key) is entry:
                self._entries.resize(key, size, touch=False)

    def compile_async(self, key: str, regex: str | Grammar, vocab: TokenVocabulary, budget: CompileBudget | None = None
                      ) -> Future:
        """Start building the index for `regex` in a background thread; a hit returns a finished future.

        Concurrent calls for the same key share one build. `budget`: the limits of its automata (default
        `CompileBudget()`; a build needs no more than `validate_regex` did, so it never fails where that passed).
        """
        entry = self.get(key)
        if entry is not None:
            done: Future = Future()
            done.set_result(entry)
            return done
        with self._lock:
            flight = self._in_flight.get(key)
            if flight is not None:
                return flight[0]
            self.num_misses += 1
            future = self._executor.submit(self._build, key, regex, vocab, budget)
            self._in_flight[key] = (future, (regex, vocab, budget))
        return future

    def get_or_compile(self, key: str, regex: str | Grammar, vocab: TokenVocabulary, budget: CompileBudget | None = None
                       ) -> CompiledIndex:
        """Return the index for `key`, building it on a miss.

        Raises:
            SchemaTooComplexError: over a limit of `budget`; or, with `max_compile_s` set, the build did not finish
                within it (it still completes in the background and is cached, but this call gives up).
            InvalidRegexError | UnsatisfiableSchemaError: see `validate_regex`.
        """
        future = self.compile_async(key, regex, vocab, budget)
        try:
            return future.result(timeout=self.max_compile_s)
        except FutureTimeout:
            raise SchemaTooComplexError(
                f"building the token index took longer than {self.max_compile_s:g} s (vocabulary of "
                f"{vocab.num_tokens:,} tokens, {_size(regex)}); simplify the schema, "
                "or raise `IndexCache(max_compile_s=...)`"
            ) from None

    def clear(self) -> None:
        """Drop every in-memory entry (files on disk stay)."""
        with self._lock:
            for entry in self._entries.values():
                _stop_reporting(None, entry)
            self._entries.clear()

    def _grew(self, key: str, index: TokenIndex, num_bytes: int) -> None:
        """`TokenIndex.on_grow` of an entry: a mask was memoised (the budget may drop older entries now). Growth is
        not use: the background warm-up grows an index nobody asked for again, which made it the most recent entry."""
        with self._lock:
            entry = self._entries.peek(key)
            if entry is not None and entry.index is index:
                self._entries.resize(key, self._entries.size_of(key) + num_bytes, touch=False)

    def _after_fork_in_child(self) -> None:
        """A child forked while builds ran (a DataLoader or pool worker forked right after a processor was built):
        their threads, and the executor's, do not exist here, so every build would wait for ever (a hang at the
        child's first constrained step, or its first new schema). The child gets a fresh lock and executor, and the
        orphaned builds run again here, each settling the future its caller already holds."""
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="hf_paged-compile")
        orphans, self._in_flight = self._in_flight, {}
        for key, (future, args) in orphans.items():
            if not future.done():
                self.compile_async(key, *args).add_done_callback(lambda done, held=future: settle(held, done))

    # -- internals -----------------------------------------------------------------------------------
    def _build(self, key: str, regex: str | Grammar, vocab: TokenVocabulary, budget: CompileBudget | None) -> CompiledIndex:
        try:
            compiled = self._load(key, regex, vocab)
            if compiled is None:
                check_regex_size(regex, self.max_regex_size)
                compiled = _compile(regex, vocab, budget=budget.for_automaton() if budget is not None else None)
                self._save(key, compiled)
            if self.max_bytes is not None:  # one index's masks never take more than the whole budget
                compiled.index.max_cached_bytes = min(compiled.index.max_cached_bytes, self.max_bytes)
            size = compiled.index.measure()
            with self._lock:
                replaced = self._entries.pop(key)  # (a concurrent build of the same key: keep the newest)
                if replaced is not None:
                    _stop_reporting(key, replaced)
                compiled.index.on_grow = lambda index, num_bytes, key=key: self._grew(key, index, num_bytes)
                self._entries.put(key, compiled, size)
            # the warm-up masks and a grammar's per-rule facts off the caller's path: the index is usable now,
            # decoding computes on first need what this has not reached yet
            try:
                self._executor.submit(warm_up, compiled)
            except RuntimeError:  # (the executor is shutting down: decoding computes them on first need)
                pass
            return compiled
        finally:
            with self._lock:
                self._in_flight.pop(key, None)

    def _path(self, key: str) -> str | None:
        return None if self.cache_dir is None else os.path.join(self.cache_dir, f"{key}.index")

    def _load(self, key: str, regex: str | Grammar, vocab: TokenVocabulary) -> CompiledIndex | None:
        path = self._path(key)
        arrays = None if path is None else read_automaton(path, regex, vocab.fingerprint)
        if arrays is None:
            return None
        try:
            dfa = ByteDFA.from_arrays(*arrays)
        except Exception:  # noqa: BLE001 -- a foreign file's arrays: rebuild (and overwrite it)
            return None
        return _compile(regex, vocab, dfa, from_disk=True)

    def _save(self, key: str, compiled: CompiledIndex) -> None:
        path = self._path(key)
        if path is None or compiled.index.dfa.lazy:  # a grammar's rows are built on demand: nothing to save
            return
        dfa = compiled.index.dfa  # the automaton only: token masks are lazy (computed per state on first visit)
        write_automaton(self.cache_dir, path, compiled.regex, compiled.vocab.fingerprint, dfa.transitions, dfa.initial,
                        dfa.finals)
        if self.max_disk_bytes is not None:
            with self._lock:
                size = os.path.getsize(path)
                self._disk_bytes = trim_dir(self.cache_dir, 0) if self._disk_bytes is None else self._disk_bytes + size
                if self._disk_bytes > self.max_disk_bytes:  # (other processes may share the directory: rescan)
                    self._disk_bytes = trim_dir(self.cache_dir, int(0.8 * self.max_disk_bytes), keep=path)


_LIVE: weakref.WeakSet[IndexCache] = weakref.WeakSet()  # every cache of this process
call_after_fork(_LIVE, "_after_fork_in_child")


def _stop_reporting(key: str | None, entry: CompiledIndex) -> None:
    """An index the cache no longer holds: a request still using it keeps it alive, its growth is not the cache's."""
    entry.index.on_grow = None


def warm_up(compiled: CompiledIndex) -> None:
    """The masks nearest the start (`TokenIndex.warm`, `WARM_UNITS`), then a grammar's per-rule facts
    (`TokenIndex.prepare`): what `IndexCache` runs in its background thread once an index is published (a failure
    there only leaves the work to decoding's first visits: logged)."""
    try:
        # (with the walks still running as Python, while their compiled versions load: a tenth, since a mask then
        # costs several times more, and decoding may never visit most of what warming computes)
        compiled.index.warm(WARM_UNITS if jit.is_compiled() else WARM_UNITS // 10)
        compiled.index.prepare()
    except Exception:  # (decoding computes the same masks and facts on first need)
        logger.exception("warming a compiled index failed; decoding computes its masks and facts on first need")


def _size(regex: str | Grammar) -> str:
    if isinstance(regex, Grammar):
        return f"grammar of {len(regex.texts)} rules, {regex.num_chars:,} characters"
    return f"regex of {len(regex):,} characters"


_DEFAULT: IndexCache | None = None
_DEFAULT_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_DEFAULT_LOCK")  # a forked child gets a free lock (after_fork.py)


def _env_max_bytes() -> int:
    """`HF_PAGED_INDEX_CACHE_MB` in bytes (a positive number of MiB), else `DEFAULT_MAX_BYTES`."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        mib = float(text)
    except ValueError:
        mib = -1.0
    if not mib > 0 or mib == float("inf"):
        raise ValueError(f"{MAX_BYTES_ENV}={text!r} is not a positive number of MiB; set e.g. {MAX_BYTES_ENV}=1024")
    return max(1, int(mib * (1 << 20)))


def default_index_cache() -> IndexCache:
    """The process-wide cache every processor uses unless given its own `index_cache=`."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = IndexCache(cache_dir=os.environ.get("HF_PAGED_INDEX_CACHE_DIR") or None,
                                  max_bytes=_env_max_bytes())
        return _DEFAULT
