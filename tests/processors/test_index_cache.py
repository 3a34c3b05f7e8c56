"""Index cache: anchoring, LRU, disk persistence, background compile, budgets."""

from __future__ import annotations

import os
import re
import threading

import numpy as np
import pytest

from hf_paged.errors import InvalidRegexError, SchemaTooComplexError, UnsatisfiableSchemaError
from hf_paged.processors import RegexLogitsProcessor
from hf_paged.processors.automaton import anchored, validate_regex
from hf_paged.processors.automaton.regex_size import estimate_regex_size
from hf_paged.processors.index.index_cache import IndexCache, index_key
from hf_paged.processors.index.vocabulary import build_vocabulary
from tests.forked import holds_in_forked_child
from tests.processors.toy_tokenizers import byte_level_tokenizer

VOCAB = build_vocabulary(byte_level_tokenizer())
V = byte_level_tokenizer().get_vocab()


def walk(index, tokens):
    state = index.get_initial_state()
    for token in tokens:
        state = index.get_next_state(state, token)
        if state is None:
            return None
    return state


def test_anchored_index_accepts_continuations_after_a_match():
    cache = IndexCache(max_entries=2)
    compiled = cache.get_or_compile("k", r"(0|[1-9][0-9]*)(\.[0-9]+)?", VOCAB)
    end = walk(compiled.index, [V["1"], V["2"], V["."], V["5"]])  # "12.5"
    assert end is not None and compiled.index.is_final_state(end)
    assert not compiled.index.is_final_state(walk(compiled.index, [V["1"], V["."]]))
    assert anchored("a|b") == r"(?:a|b)\z"


def test_an_index_growing_in_the_background_is_not_a_use():
    """`test_lru_evicts_the_least_recently_used` failed in a loaded full run: the background warm-up memoised a mask
    of "b" after "a" was read, and growth counted as use, so "a" was evicted. Growth is now weighed, not touched."""
    cache = IndexCache(max_entries=2)
    cache.get_or_compile("a", "a", VOCAB)
    b = cache.get_or_compile("b", "b", VOCAB)
    assert cache.get("a") is not None
    cache._grew("b", b.index, 64)  # what TokenIndex.on_grow reports when a mask of "b" is memoised
    cache.get_or_compile("c", "c", VOCAB)
    assert cache.get("b") is None and cache.get("a") is not None


def test_lru_evicts_the_least_recently_used():
    cache = IndexCache(max_entries=2)
    cache.get_or_compile("a", "a", VOCAB)
    cache.get_or_compile("b", "b", VOCAB)
    assert cache.get("a") is not None  # "a" is now the most recent
    cache.get_or_compile("c", "c", VOCAB)
    assert cache.get("b") is None and cache.get("a") is not None and len(cache) == 2
    assert cache.num_misses == 3


def test_compile_async_shares_one_build():
    cache = IndexCache()
    first = cache.compile_async("k", "[a-c]{2}", VOCAB)
    second = cache.compile_async("k", "[a-c]{2}", VOCAB)
    assert first.result(timeout=30) is second.result(timeout=30)
    assert cache.num_misses == 1
    hit = cache.compile_async("k", "[a-c]{2}", VOCAB)
    assert hit.done() and hit.result() is first.result()


def test_disk_persistence_round_trip(tmp_path):
    key = index_key("regex", "ab?c", None, VOCAB.fingerprint)
    built = IndexCache(cache_dir=tmp_path).get_or_compile(key, "ab?c", VOCAB)
    assert not built.from_disk and os.listdir(tmp_path) == [f"{key}.index"]
    loaded = IndexCache(cache_dir=tmp_path).get_or_compile(key, "ab?c", VOCAB)
    assert loaded.from_disk and loaded.compile_s == 0.0
    assert np.array_equal(loaded.index.dfa.transitions, built.index.dfa.transitions)
    assert np.array_equal(loaded.index.dfa.finals, built.index.dfa.finals)
    # a file whose content does not match the key's regex is ignored and rebuilt
    other = IndexCache(cache_dir=tmp_path).get_or_compile(key, "abc", VOCAB)
    assert not other.from_disk


def test_regex_size_estimate_and_budget():
    assert estimate_regex_size("a{3}(bc){2}") == 7
    assert estimate_regex_size("(x{100}){100}") == 10_000
    assert estimate_regex_size("[^a{99}]") == 1  # braces inside a class are literals
    with pytest.raises(SchemaTooComplexError, match="max_regex_size"):
        validate_regex("a{99999999}")  # would exhaust memory inside regex-automata
    with pytest.raises(SchemaTooComplexError):
        IndexCache(max_regex_size=50).get_or_compile("big", "[ab]{60}", VOCAB)


def test_a_unicode_property_counts_as_its_automaton():
    """`\\p{..}` patterns are built by outlines-core, without a work budget (~10 ms an occurrence): each property
    counts as its UTF-8 automaton's states (`\\p{L}`: ~300), so `[\\p{L}]{3000}` (50 s of CPU before) is refused by
    the size estimate before any build; one occurrence, or a class of two properties, stays small."""
    letters = estimate_regex_size(r"\p{L}")
    assert 100 < letters < 1_000
    assert estimate_regex_size(r"[\p{L}]{3000}") == estimate_regex_size(r"\pL{3000}") == 3000 * letters
    assert estimate_regex_size(r"[\p{L}\p{N}_]") == letters + estimate_regex_size(r"\p{N}")
    assert estimate_regex_size(r"\d{4}") == 4 and estimate_regex_size(r"[\\p]") == 1  # (an escaped backslash)
    with pytest.raises(SchemaTooComplexError, match="max_regex_size"):
        validate_regex(r"[\p{L}]{3000}")
    validate_regex(r"[\p{L} ]{1,10}")


def test_bad_patterns():
    with pytest.raises(InvalidRegexError, match="does not compile"):
        validate_regex("a(")
    with pytest.raises(UnsatisfiableSchemaError):
        validate_regex(r"[^\x00-\x{10FFFF}]")


def test_compile_time_budget(monkeypatch):
    cache = IndexCache(max_compile_s=0.05)
    release = threading.Event()
    real_build = cache._build

    def slow_build(*args):  # a build that outlasts the opt-in wait, deterministically
        release.wait(5)
        return real_build(*args)

    monkeypatch.setattr(cache, "_build", slow_build)
    with pytest.raises(SchemaTooComplexError, match="max_compile_s"):
        cache.get_or_compile("slow", "[a-z]{1,4}", VOCAB)
    release.set()
    # the build still finishes in the background and is cached for the next caller
    assert cache.compile_async("slow", "[a-z]{1,4}", VOCAB).result(timeout=30).regex == "[a-z]{1,4}"


def test_outlines_core_errors_are_typed_by_where_they_come_from():
    # Rust-only syntax goes to outlines-core; whatever it refuses is an InvalidRegexError (no message matching)
    with pytest.raises(InvalidRegexError, match="does not compile"):
        validate_regex(r"\p{NoSuchClass}+")
    assert IndexCache().get_or_compile("p", r"\p{Greek}", VOCAB) is not None  # compiled by outlines-core
    with pytest.raises(UnsatisfiableSchemaError):  # our compiler: an empty language is typed as such
        validate_regex(r"a[^\x00-\x{10FFFF}]b")


@pytest.mark.parametrize(("pattern", "why"), [
    ("(ab", "'(ab' does not compile: missing ), unterminated subpattern at position 0"),
    ("a{3,1}", "'a{3,1}' does not compile: min repeat greater than max repeat at position 2"),
    (r"\bab", "word boundaries"),
    (r"x\Aab\z", "anchor nothing here"),  # (a leading \A holds at the text's start: r"\Aab\z" compiles, 2671606)
])
def test_a_pattern_the_automaton_refuses_is_named_with_its_fault(pattern, why):
    """outlines-core's messages named our wrapping of the pattern ('(?:(ab)\\z'), a state number, or 'Unicode word
    boundaries' with no way out."""
    with pytest.raises(InvalidRegexError, match=re.escape(why)):
        RegexLogitsProcessor(pattern, byte_level_tokenizer())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_process_forked_mid_build_finishes_the_build_and_compiles_new_ones(monkeypatch):
    """A DataLoader or pool worker forked while a build ran: the executor's threads stay in the parent, and the
    child's first constrained step (the build's future) or first new schema waited for ever. The child reruns the
    orphaned builds on a fresh executor; the futures its callers hold settle."""
    cache = IndexCache(max_entries=4)
    gate, entered, original = threading.Event(), threading.Event(), IndexCache._build

    def build(self, key, *args):
        if key == "held" and not entered.is_set():  # the parent's build: still running when the process forks
            entered.set()
            gate.wait(30)
        return original(self, key, *args)

    monkeypatch.setattr(IndexCache, "_build", build)
    held = cache.compile_async("held", "ab+", VOCAB)
    assert entered.wait(30)

    def child() -> bool:
        first = held.result(timeout=20)  # the future taken before the fork
        fresh = cache.get_or_compile("fresh", "c+", VOCAB)  # a build asked for after it
        return walk(first.index, [V["a"], V["b"]]) is not None and walk(fresh.index, [V["c"]]) is not None

    assert holds_in_forked_child(child, after=gate.set), "the forked child's builds did not finish"
    assert held.result(timeout=30) is not None  # the parent's own build went on
