"""Our regex compiler (`automaton/`) against outlines-core's, and the compiled kernels against their Python twins."""

from __future__ import annotations

import numpy as np
import pytest

from hf_paged.errors import InvalidRegexError, SchemaTooComplexError, UnsatisfiableSchemaError
from hf_paged.processors import jit
from hf_paged.processors.automaton import Unsupported, anchored, compile_regex
from hf_paged.processors.automaton import dfa as dfa_module
from hf_paged.processors.automaton.byte_dfa import _outlines_byte_dfa, build_byte_dfa
from hf_paged.processors.automaton.dfa import flat_nfa
from hf_paged.processors.automaton.dfa_kernel import subset_construction
from hf_paged.processors.automaton.nfa import build_nfa
from hf_paged.processors.automaton.syntax import parse
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index.closed_states import _closed, _closed_numpy
from hf_paged.processors.schema.ladder import schema_to_grammar, schema_to_regex

REGEXES = [
    "ab", "a|b", "a*", "[0-9]+(\\.[0-9]+)?", ".{3}", "(a*)*b", "a{0}", "x(?:)*y",
    "[^a-c\\x00]{2}", "\\u00e9+|\\u4e2d", "[\\x{10000}-\\x{10FFFF}]", "(?:a|ab|abc)(?:c|bc)?", "(?s:.)", "a(?:$)",
    "[ab]*a[ab]{5}", "(?:[ -~]|\\\\[\"\\\\])*", "-?(?:0|[1-9][0-9]*)(?:[eE][+\\-]?[0-9]+)?",
    "\"(?:[^\"\\\\\\x00-\\x1f]|\\\\u[0-9a-fA-F]{4})*\"", "(?P<x>ab)+", "[^\\n]*", "[]a]b", "a{2,}", "(?:ab){2,3}?",
    # literal alternations (built as a trie): shared prefixes, one a prefix of another, the empty one, non-ASCII
    "(?:abc|abd|ab|\\u00e9x|\\u00e9|a|)", "\"(?:red|green|blue|re|\\u4e2d\\u6587)\"", "(?:x|y|z)+",
]
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
     "required": ["name"]},
    {"type": "array", "items": {"enum": ["x", 1, None, True]}, "maxItems": 3},
    {"anyOf": [{"type": "string", "format": "date"}, {"type": "number", "minimum": -2.5, "maximum": 1000}]},
    {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"}},
]


def _python_dfa(regex: str):
    """The DFA of `regex` through the Python reader and builder, whether or not the compiled ones are loaded."""
    return dfa_module.determinize(flat_nfa(build_nfa(parse(regex), CompileBudget())), CompileBudget())


def _equivalent(a, b) -> bool:
    """Two byte DFAs accept the same texts (a product walk over every byte from the initial states)."""
    seen = {(0, 0)}
    frontier = np.array([[0, 0]])
    while frontier.shape[0]:
        if (a.finals[frontier[:, 0]] != b.finals[frontier[:, 1]]).any():
            return False
        pairs = np.unique(np.stack([a.transitions[frontier[:, 0]].reshape(-1),
                                    b.transitions[frontier[:, 1]].reshape(-1)], axis=1), axis=0)
        new = [p for p in map(tuple, pairs.tolist()) if p not in seen]
        seen.update(new)
        frontier = np.array(new, dtype=np.int64).reshape(-1, 2)
    return True


@pytest.mark.parametrize("regex", REGEXES + [schema_to_regex(s) for s in SCHEMAS])
def test_the_byte_automaton_matches_outlines_cores(regex):
    ours = compile_regex(regex, CompileBudget())
    assert ours is not None and _equivalent(ours, _outlines_byte_dfa(anchored(regex)))


def test_literal_alternations_as_tries_match_the_plain_construction(monkeypatch):
    import random

    from hf_paged.processors.automaton import nfa as nfa_module
    from hf_paged.processors.schema.fragments import alt, lit

    rng = random.Random(7)
    alphabet = ["a", "b", "\u00e9", "\u4e2d", "\U0001f600", '"', "\\", "\n"]
    for _ in range(60):
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(3, 12))]
        regex = alt(lit(w) for w in words).text + rng.choice(["", "c", "(?:a|b)*"])
        trie, trie_states = _python_dfa(regex), len(build_nfa(parse(regex), CompileBudget()).kinds)
        monkeypatch.setattr(nfa_module, "MIN_TRIE", 10**9)
        plain, plain_states = _python_dfa(regex), len(build_nfa(parse(regex), CompileBudget()).kinds)
        monkeypatch.undo()
        assert _equivalent(trie, plain), regex
        assert trie_states <= plain_states + 1, regex  # (+1: the trie's root split where no two words share a start)


@pytest.mark.parametrize("regex", ["^a$|b", "(?:^)a|c", "a^b", "(?:$)a|b$", "\\Aa\\Z", "\\d{1,2}", "(?:\\w\\s)+"])
def test_anchors_and_unicode_classes_match_pythons_full_match(regex):
    """Python's `re` is the reference here: outlines-core cannot build a start anchor, and `\\d \\w \\s` follow
    Python's Unicode tables (Rust's regex may know a newer Unicode version's few extra characters)."""
    import re

    ours = compile_regex(regex, CompileBudget())
    for text in ("", "a", "b", "c", "ab", "ba", "aa", "7", "42", "\u0663", "x y ", "\u00e9\u3000"):
        state = 0
        for byte in text.encode():
            state = ours.transitions[state, byte] if ours is not None else 0
        accepted = ours is not None and bool(ours.finals[state])
        assert accepted == bool(re.fullmatch(regex.replace("\\Z", "\\Z"), text)), (regex, text)


def test_grammar_rules_match_outlines_core_too():
    from hf_paged.processors.automaton.grammar import Grammar

    grammar = schema_to_grammar({"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array",
                                 "items": {"$ref": "#/$defs/t"}}, "id": {"type": "string"}}}}, "$ref": "#/$defs/t"})
    for rule in grammar.texts if isinstance(grammar, Grammar) else [grammar]:
        assert _equivalent(compile_regex(rule, CompileBudget()), _outlines_byte_dfa(anchored(rule)))


def test_syntax_only_rust_reads_right_goes_to_outlines_core():
    for regex in ("\\p{Greek}+", "[[:alpha:]]", "[a-z&&[^m]]", "(?i)abc", "\\bword\\b"):
        with pytest.raises(Unsupported):
            parse(regex)
        try:
            build_byte_dfa(anchored(regex))  # outlines-core builds it ...
        except InvalidRegexError:  # ... or refuses it (`\\b`: no Unicode word boundary in its DFAs)
            pass


def test_typed_errors():
    with pytest.raises(InvalidRegexError, match="look-around"):
        parse("a(?=b)")
    with pytest.raises(InvalidRegexError):
        build_byte_dfa(anchored("a("))
    with pytest.raises(UnsatisfiableSchemaError):
        build_byte_dfa(anchored("a[^\\x00-\\x{10FFFF}]"))
    with pytest.raises(SchemaTooComplexError, match="max_nfa_states"):
        build_byte_dfa(anchored("(?:x{1000}){1000}"))
    deep = "(" * 600 + "a" + ")" * 600  # nested groups: no recursion in our reader or NFA builder
    assert compile_regex(deep, CompileBudget()) is not None


def test_dead_ends_are_trimmed():
    dfa = compile_regex("a(?:b[^\\x00-\\x{10FFFF}]|c)", CompileBudget())  # `ab` leads nowhere: `b` is dead
    assert dfa.transitions[dfa.transitions[0, ord("a")], ord("b")] == dfa.transitions.shape[0] - 1


@pytest.fixture(scope="module")
def compiled():
    if not jit.wait(1800):  # a cold numba cache on a loaded machine: the compile child runs at nice 10
        pytest.skip("numba is unavailable here: only the Python twins run")


def test_compiled_subset_construction_equals_its_twin(compiled, monkeypatch):
    calls = []
    monkeypatch.setattr(dfa_module, "subset_construction", lambda *args: calls.append(args) or subset_construction(*args))
    # (a state of 40 overlapping spans and 80 piece bounds: the kernel's numpy sorts, beside its small in-place ones)
    wide = "(?:" + "|".join(f"[{chr(97 + i % 20)}-z]{i}" for i in range(40)) + ")"
    for regex in REGEXES + [schema_to_regex(s) for s in SCHEMAS] + [wide]:
        dfa_module.determinize(flat_nfa(build_nfa(parse(regex), CompileBudget())), CompileBudget())
    for pattern, limits in (("(a|b)*a(a|b){14}", (2000, 10**9)), ("(.*,){4}x.{6}", (10**6, 3000))):
        args = list(calls[0])
        nfa = flat_nfa(build_nfa(parse(pattern), CompileBudget()))
        dfa_module.determinize(nfa, CompileBudget(max_dfa_states=10**6, max_dfa_steps=10**9))
        args = list(calls[-1])
        args[-2:] = limits  # stopped by each limit, at the same point
        calls.append(tuple(args))
    for args in calls:
        twin, fast = subset_construction.python(*args), subset_construction.compiled(*args)
        assert tuple(map(int, twin[:3])) == tuple(map(int, fast[:3]))
        assert all(np.array_equal(x, y) for x, y in zip(twin[3:], fast[3:]))


def test_closed_states_twin_equals_the_loop(compiled):
    rng = np.random.default_rng(7)
    for _ in range(30):
        num_states = int(rng.integers(3, 40))
        dead = num_states - 1
        table = rng.choice(np.append(np.arange(num_states), [dead] * 3), size=(num_states, 256)).astype(np.int32)
        table[dead] = dead
        inside = rng.random(num_states) < 0.9
        columns = np.array(sorted(rng.choice(128, size=int(rng.integers(1, 20)), replace=False)), dtype=np.int64)
        assert np.array_equal(_closed.compiled(table, inside, dead, columns), _closed_numpy(table, inside, dead, columns))


def test_the_warm_ups_cover_the_signatures_the_masks_use(compiled):
    """After the switch, a schema's compile and masks never fall back to Python (a missing warm-up would)."""
    from hf_paged.processors import JSONSchemaLogitsProcessor
    from hf_paged.processors.index.index_cache import IndexCache
    from tests.processors.hostile_inputs import gpt2_or_toy

    tok = gpt2_or_toy()
    for schema in SCHEMAS:
        index = JSONSchemaLogitsProcessor(schema, tok, index_cache=IndexCache()).compiled.index
        index.warm(10_000)
    assert [k.__name__ for k in jit._KERNELS if k.misses] == []


def test_compiled_live_states_equal_their_twin(compiled):
    from hf_paged.processors.automaton.layout_kernel import live_states

    rng = np.random.default_rng(7)
    for num_states in (1, 5, 60, 500):
        edges = rng.integers(0, num_states, size=(2 * num_states, 2))  # (from, to)
        pairs = np.unique(edges[:, 1] * num_states + edges[:, 0])
        starts = np.searchsorted(pairs // num_states, np.arange(num_states + 1))
        finals = rng.random(num_states) < 0.1
        twin = live_states.python(starts, pairs % num_states, finals)
        assert np.array_equal(live_states.compiled(starts, pairs % num_states, finals), twin)
        assert twin[finals].all()


def _determinize_calls(monkeypatch, name: str) -> list[tuple]:
    """The arguments `dfa.determinize` passes to its kernel `name` for every automaton above."""
    calls: list[tuple] = []
    kernel = getattr(dfa_module, name)
    monkeypatch.setattr(dfa_module, name, lambda *args: calls.append(args) or kernel(*args))
    for regex in REGEXES + [schema_to_regex(s) for s in SCHEMAS]:
        dfa_module.determinize(flat_nfa(build_nfa(parse(regex), CompileBudget())), CompileBudget())
    return calls


def test_compiled_trim_equals_its_twin(compiled, monkeypatch):
    """The table of every automaton above, and of random run lists (dead ends, unreachable finals, a dead start)."""
    from hf_paged.processors.automaton import layout_kernel as trim_kernel

    calls = _determinize_calls(monkeypatch, "trim_table")
    rng = np.random.default_rng(11)
    byte_class = np.repeat(np.arange(8), 32).astype(np.int64)
    for num_states in (1, 3, 20, 200):
        per_state = rng.integers(0, 4, size=num_states)
        run_ptr = np.concatenate(([0], np.cumsum(per_state))).astype(np.int64)
        first = rng.integers(0, 8, size=int(run_ptr[-1]))
        runs = np.stack([first, np.minimum(first + rng.integers(0, 3, size=first.shape[0]), 7),
                         rng.integers(-1, num_states, size=first.shape[0])], axis=1).astype(np.int64)
        calls.append((runs, run_ptr, rng.random(num_states) < 0.2, byte_class))
    assert any(not trim_kernel.trim_table.python(*args)[0] for args in calls)  # (a dead start among them)
    for args in calls:
        twin, fast = trim_kernel.trim_table.python(*args), trim_kernel.trim_table.compiled(*args)
        assert bool(twin[0]) == bool(fast[0]) and all(np.array_equal(x, y) for x, y in zip(twin[1:], fast[1:]))
        assert twin[1].dtype == fast[1].dtype == np.int32 and twin[2].dtype == fast[2].dtype == np.bool_


def test_compiled_nfa_layout_equals_its_twin(compiled, monkeypatch):
    """Byte classes, sorted spans and CSR of every automaton above, and of NFAs with shuffled, repeated spans."""
    from hf_paged.processors.automaton import layout_kernel

    calls = _determinize_calls(monkeypatch, "nfa_layout")
    rng = np.random.default_rng(5)
    for num_states in (1, 4, 50):
        kinds = rng.integers(0, 4, size=num_states).astype(np.int8)
        sparse, split = np.flatnonzero(kinds == 0), np.flatnonzero(kinds == 1)
        counts = rng.integers(1, 6, size=sparse.shape[0]).astype(np.int64)
        lo = rng.integers(0, 256, size=int(counts.sum()))
        flat = np.stack([lo, np.minimum(lo + rng.integers(0, 40, size=lo.shape[0]), 255),
                         rng.integers(0, num_states, size=lo.shape[0])], axis=1).astype(np.int64)
        flat[1::3] = flat[::3][: flat[1::3].shape[0]]  # repeated spans
        calls.append((kinds, sparse.astype(np.int64), counts, flat, split.astype(np.int64),
                      rng.integers(1, 4, size=split.shape[0]).astype(np.int64)))
    for args in calls:
        twin, fast = layout_kernel.nfa_layout.python(*args), layout_kernel.nfa_layout.compiled(*args)
        assert all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(twin, fast))


def test_compiled_multibyte_ends_equal_their_twin(compiled):
    """Every state of JSON string bodies, non-ASCII classes and random tables (uniform continuation rows or not)."""
    from hf_paged.processors.automaton.utf8 import multibyte_ends_all, multibyte_ends_numpy

    tables = [compile_regex(regex, CompileBudget()).transitions for regex in REGEXES + [schema_to_regex(s)
                                                                                        for s in SCHEMAS]]
    rng = np.random.default_rng(3)
    for num_states in (1, 5, 40):
        table = rng.integers(0, num_states, size=(num_states, 256)).astype(np.int32)
        if num_states > 1:
            table[:, 0x80:0xC0] = rng.integers(0, num_states, size=(num_states, 1))
        tables.append(table)
    for table in tables:
        table = np.ascontiguousarray(table, dtype=np.int32)
        assert np.array_equal(multibyte_ends_all.compiled(table), multibyte_ends_numpy(table))
