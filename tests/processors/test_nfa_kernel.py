"""The compiled regex reader and NFA builder (`nfa_kernel`) against the Python ones (`syntax.parse`, `nfa.build_nfa`):
the same states in the same order, the same count of positions, the same budget errors, and no pattern of the fast
reader's syntax left to the Python path."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from hf_paged.errors import SchemaTooComplexError
from hf_paged.processors import jit
from hf_paged.processors.automaton import nfa_kernel
from hf_paged.processors.automaton.byte_dfa import compile_regex, regex_nfa
from hf_paged.processors.automaton.dfa import flat_nfa
from hf_paged.processors.automaton.nfa import build_nfa
from hf_paged.processors.automaton.syntax import _Bail, _parse_fast, parse
from hf_paged.processors.automaton.tree import Unsupported
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.schema.ladder import schema_to_regex

EDGE_CASES = [
    "", "a", "a|b", "a|b|c", "(?:ab|cd|ef)", "(?:|a|b)", "(?:a|ab|abc|b)", "é|ü|a", "(?:\u4e2d|\U0001f600|x)+",
    "[a-c]", "[^a]", "[]a]", "[^]a]", "[\\-a]", "[a-]", "[-a]", "[\\x00-\\x1f]", "[\\u00e0-\\u00ff]+", "[^\"\\\\]*",
    "[\\ud7ff-\\ue000]", "[\ud800-\udfff]", "\ud800", "\\ud800x", "[\\u{1F600}-\\u{1F64F}]", "\\x{41}\\u{10FFFF}",
    "\\U0010FFFF", "\\x414", "a*", "a+", "a?", "a*?", "a{2}", "a{2,4}", "a{2,}", "a{0}", "a{0,0}", "a{0,}",
    "(?:ab)*", "(?:a*)?", "(?:a|b)+c", "(a)", "(?:)", "(?:)*", "(?:){3}", "(?:^)*", "^a$", ".", ".*x", "\\n\\t\\r",
    "\\.\\[\\]\\{\\}", '"(?:[^"\\\\\\x00-\\x1f]|\\\\["\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4})*"', "(?:(?:a{2}){3}){2}",
    "a{1000}",
    # the fast reader hands these to Python's parser (the kernel must give up, never guess)
    "\\d", "(?i)a", "[a-z&&b]", "[a--b]", "[[a]]", "a{3,2}", "a**", "a{", "a}", "#", "(", ")", "[a", "a\\",
    "\\x{110000}", "[\\U00110000]", "\\p{L}", "a{1234567890123456789}", "[\\d]", "[z-a]",
]
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
     "required": ["name"]},
    {"type": "array", "items": {"enum": ["x", 1, None, True, "\u00e9t\u00e9"]}, "maxItems": 3},
    {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "number", "minimum": -2.5, "maximum": 1000}]},
    {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"}},
]
_ATOMS = ["a", "b", "z9", "\\.", "\\-", "\\n", "\\x41", "\\u00e9", "\\U0001F600", "\\u{20AC}", "é", "\u4e2d",
          "\U0001f600", "\ud800", "[a-c]", "[^a]", "[\\u00e0-\\u00ff]", "[]x]", "[a\\-]", "[\\x00-\\x1f\"\\\\]", ".",
          "^", "$", " ", "'", "@", "-", "[^\\u0080-\\U0010FFFF]"]
_QUANTIFIERS = ["", "", "", "*", "+", "?", "{2}", "{0,3}", "{1,}", "*?", "{0}", "{3,1}", "**"]


def _random_regex(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(0, 4)):
        if depth < 4 and rng.random() < 0.3:
            alternatives = [_random_regex(rng, depth + 1) for _ in range(rng.randint(1, 5))]
            atom = rng.choice(["(?:", "(", "(?:"]) + "|".join(alternatives) + ")"
        else:
            atom = rng.choice(_ATOMS)
        parts.append(atom + rng.choice(_QUANTIFIERS))
    return "".join(parts)


def _python(regex: str, budget: CompileBudget):
    """The Python path's outcome: ("ok", FlatNFA) or ("error", its class, positions counted)."""
    try:
        return "ok", flat_nfa(build_nfa(parse(regex), budget))
    except Exception as exc:  # noqa: BLE001 -- compared by class with the kernel's outcome
        return "error", type(exc), budget.nfa_states


def _fast_syntax(regex: str) -> bool:
    """Whether the fast reader reads `regex` (counts of 19+ digits aside: the kernel leaves those to Python)."""
    if re.search("[0-9]{19}", regex):
        return False
    try:
        _parse_fast(regex)
    except (_Bail, Unsupported):
        return False
    except Exception:  # noqa: BLE001 -- a pattern the fast reader rejects itself
        return False
    return True


def _corpus() -> list[str]:
    rng = random.Random(11)
    return EDGE_CASES + [schema_to_regex(s) for s in SCHEMAS] + [_random_regex(rng) for _ in range(600)]


@pytest.fixture(scope="module")
def compiled():
    if not jit.wait(1800):  # a cold numba cache on a loaded machine: the compile child runs at nice 10
        pytest.skip("numba is unavailable here: only the Python path runs")


def test_the_compiled_reader_builds_the_python_builders_nfa_state_for_state(compiled):
    kinds_seen = set()
    for regex in _corpus():
        for left in (150_000, 4_095, 4_097, 0):
            status, positions, start, *arrays = nfa_kernel.regex_nfa(nfa_kernel.codes_of(regex), left)
            reference = _python(regex, CompileBudget(max_nfa_states=left))
            if status == nfa_kernel.GIVE_UP:
                assert not _fast_syntax(regex), f"the kernel left {regex!r} to the Python path"
                kinds_seen.add("give up")
                continue
            assert _fast_syntax(regex), regex
            if reference[0] == "error":
                assert reference[1] is SchemaTooComplexError, (regex, reference)
                assert (status == nfa_kernel.OVER or positions > left) and positions == reference[2], (regex, left)
                kinds_seen.add("over")
                continue
            assert status == nfa_kernel.OK and positions <= left, (regex, left)
            expected = reference[1]
            assert (positions, start) == (expected.kinds.shape[0], expected.start), regex
            for name, got in zip(("kinds", "sparse", "counts", "flat", "split", "eps_counts", "eps", "look"), arrays):
                assert np.array_equal(got, getattr(expected, name)), (regex, name)
            kinds_seen.add("same")
    assert kinds_seen == {"give up", "over", "same"}


def test_regex_nfa_counts_the_same_work_and_raises_the_same_error_either_way(compiled):
    for regex, limit in (("(?:[a-f0-9]{4}-){300}", 150_000), ("(?:[a-f0-9]{4}-){3000}", 150_000),
                         ("\\U0001F600{5000}", 9_000), ("[^a]{900}", 4_096)):
        python = CompileBudget(max_nfa_states=limit)
        reference = _python(regex, python)
        budget = CompileBudget(max_nfa_states=limit)
        if reference[0] == "ok":
            nfa = regex_nfa(regex, budget)
            assert np.array_equal(nfa.flat, reference[1].flat) and nfa.start == reference[1].start
        else:
            with pytest.raises(SchemaTooComplexError, match="nfa states"):
                regex_nfa(regex, budget)
        assert budget.nfa_states == python.nfa_states, regex


def test_limits_past_what_int64_holds_reach_the_kernels_as_a_limit_never_met(compiled):
    budget = CompileBudget(max_nfa_states=10**20, max_dfa_states=10**20, max_dfa_steps=10**20)
    dfa = compile_regex("(?:ab|cd)+", budget)
    assert dfa is not None and budget.nfa_states == len(build_nfa(parse("(?:ab|cd)+"), CompileBudget()).kinds)
