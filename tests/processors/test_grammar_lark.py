"""The Lark EBNF front end (`grammar_lark_*`): the compiled automaton accepts exactly what Lark's Earley parser
accepts, left recursion is rewritten or refused, reserved bytes stay out, and every refusal is a typed error."""

from __future__ import annotations

import random

import pytest

from hf_paged.errors import (
    GrammarError,
    GrammarSyntaxError,
    LeftRecursionError,
    SchemaError,
    SchemaTooComplexError,
    UndefinedRuleError,
    UnsatisfiableSchemaError,
    UnsupportedGrammarError,
)
from hf_paged.processors.automaton import build_automaton
from hf_paged.processors.automaton.grammar import Grammar
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.lark.compile import compile_lark
from hf_paged.processors.lark.syntax import parse_lark
from tests.processors.lark_grammars import (
    ARITHMETIC,
    GRAMMARS,
    SQL,
    Sentences,
    lark_accepts,
    lark_parser,
    mutations,
    walk,
)

lark = pytest.importorskip("lark")


def automaton(grammar: str, start: str = "start"):
    return build_automaton(compile_lark(grammar, start).constraint)


def agree(grammar: str, texts: list[str], start: str = "start") -> list[tuple[str, bool, bool]]:
    """The texts on which our automaton and Lark disagree: (text, ours, Lark's)."""
    dfa, parser = automaton(grammar, start), lark_parser(grammar, start=start)
    out = []
    for text in texts:
        ours, theirs = dfa.accepts(text.encode()), lark_accepts(parser, text)
        if ours != theirs:
            out.append((text, ours, theirs))
    return out


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_automaton_accepts_exactly_what_lark_accepts(name):
    grammar = GRAMMARS[name]
    rng = random.Random(7)
    derived = Sentences(grammar, seed=7)
    positives = [derived.sentence() for _ in range(40)]  # from the grammar's own definitions
    dfa = automaton(grammar)
    walks = [w for w in (walk(dfa, rng) for _ in range(40)) if w is not None]  # what our automaton offers
    parser = lark_parser(grammar)
    assert all(lark_accepts(parser, text) for text in positives), "the derivations are sentences"
    assert all(dfa.accepts(text.encode()) for text in positives)
    alphabet = "".join(sorted(set("".join(positives + walks)))) + "()x;'\""
    negatives = [m for text in positives[:25] + walks[:25] for m in mutations(text, rng, 6, alphabet)]
    assert agree(grammar, walks + negatives) == []
    assert sum(not dfa.accepts(t.encode()) for t in negatives) > 50  # the mutations do find refused texts


def test_direct_left_recursion_is_rewritten_keeping_the_language():
    compiled = compile_lark(ARITHMETIC)
    assert compiled.rewritten == ("expr", "term")
    texts = ["1", "1+2", "1-2-3", "2*3+4", "2*(3+4)", "(((1)))", "-1--2", "1 + 2 * 3", "1+", "+1", "(1", "1)", "1 2"]
    assert agree(ARITHMETIC, texts) == []
    # several recursive alternatives, a nullable tail, a recursive tail
    grammar = 'start: a\na: a "x" | a "y" a | "b" | a\n'
    assert agree(grammar, ["b", "bx", "bxx", "byb", "bybx", "bxyb", "x", "by", "", "bb"]) == []


def test_rules_outside_recursion_are_inlined_and_recursive_ones_called():
    compiled = compile_lark(SQL)
    assert compiled.rule_names[0] == "" and set(compiled.rule_names[1:]) == {"condition", "conjunction", "comparison"}
    flat = compile_lark('start: pair ("," pair)*\npair: KEY ":" KEY\nKEY: /[a-z]+/\n')
    assert not isinstance(flat.constraint, Grammar)  # no call left: a plain regex (every row built at once)


@pytest.mark.parametrize("name", ["DIGIT", "HEXDIGIT", "INT", "SIGNED_INT", "DECIMAL", "FLOAT", "SIGNED_FLOAT", "NUMBER",
                                  "SIGNED_NUMBER", "ESCAPED_STRING", "LCASE_LETTER", "UCASE_LETTER", "LETTER", "WORD",
                                  "CNAME", "WS_INLINE", "WS", "CR", "LF", "NEWLINE", "SH_COMMENT", "CPP_COMMENT",
                                  "C_COMMENT", "SQL_COMMENT"])
def test_common_terminals_match_lark(name):
    grammar = f"start: {name}\n%import common.{name}\n"
    rng = random.Random(name)
    dfa = automaton(grammar)
    walks = [w for w in (walk(dfa, rng, stop=0.3) for _ in range(30)) if w is not None]
    assert walks
    alphabet = '09aZ_.+-eE" \\\t\r\n/*#'
    handmade = ['"a\\"b"', '"a\\\\"', '"a\\"', '"a"b"', "/* a */", "/* a */ */", "/**/", "/*/", "1.", ".5", "1e5", "1.5E-3"]
    texts = walks + [m for w in walks for m in mutations(w, rng, 4, alphabet)] + handmade
    assert agree(grammar, texts) == []


def test_literals_escapes_flags_ranges_and_counted_repetition_match_lark():
    grammar = r'''
start: "\x41\"\\" /a.c/s "ab"i KEY~2 ("-"|"+")~1..3 B
KEY: "k".."m"
B: /[xy]+/i
'''
    texts = ['A"\\abcABkk-X', 'A"\\a\ncaBlm+-+yYx', 'A"\\abcabkk-', 'A"\\abcabk-x', 'A"\\abcabkk----x', 'a"\\abcabkk-x',
             'A"\\axcabmm+xy', 'A"\\abcabkn-x']
    assert agree(grammar, texts) == []


def test_priorities_aliases_and_modifiers_are_accepted_and_ignored():
    grammar = '?start.2: !pair -> whole\n!pair: "a" "b" -> ab\n    | "c"\n'
    assert agree(grammar.replace("!pair -> whole", "pair -> whole"), ["ab", "c", "abc", ""]) == []
    with pytest.raises(GrammarSyntaxError):
        compile_lark(grammar)  # (`!` goes before a definition, never before a use: Lark refuses it too)


def test_start_argument_names_the_root():
    assert agree(SQL, ["a = 1", "not (a < 'x') and b.c >= 2", "select a from b"], start="condition") == []


def test_reserved_call_bytes_never_match():
    dfa = automaton('start: "<" /./ /[^"]/ WS_INLINE? ">"\n%import common.WS_INLINE\n')
    assert dfa.accepts(b"<ab>") and dfa.accepts("<\u00e9\u4e2d\t>".encode())
    for byte in [0x02, *range(0x0E, 0x20)]:
        assert not dfa.accepts(b"<" + bytes([byte]) + b"b>")
        assert not dfa.accepts(b"<a" + bytes([byte]) + b">")
    assert dfa.accepts(b"<\x01\x0d>")  # other control characters are plain characters
    with pytest.raises(UnsupportedGrammarError, match="reserves"):
        compile_lark('start: "a\\x1bb"\n')
    with pytest.raises(UnsupportedGrammarError, match="reserves"):
        compile_lark("start: /[\\x0e-\\x1f]/\n")


@pytest.mark.parametrize("grammar, error, words", [
    ('start: "a" )\n', GrammarSyntaxError, "line 1, column 12"),
    ('start: "a"\n\nfoo "b"\n', GrammarSyntaxError, "line 3"),
    ('start: "a\n', GrammarSyntaxError, "line 1"),
    ('start: "a"\nstart: "b"\n', GrammarSyntaxError, "defined twice"),
    ('start: ""\n', GrammarSyntaxError, "empty string"),
    ("", UndefinedRuleError, "defines no rule"),
    ("// nothing but a comment\n", UndefinedRuleError, "defines no rule"),
    ('begin: "a"\n', UndefinedRuleError, "'start'"),
    ('start: expr\nexp: "a"\n', UndefinedRuleError, "did you mean 'exp'"),
    ('start: NUMBR\nNUMBER: "1"\n', UndefinedRuleError, "terminal 'NUMBR' (line 1, column 8)"),
    ("start: X\n%import common.NOPE -> X\n", UndefinedRuleError, "common has no terminal"),
    ('start: a\na: b "x" | "y"\nb: a "z"\n', LeftRecursionError, "a -> b -> a"),
    ('start: a\na: B a "x" | "y"\nB: "b"?\n', LeftRecursionError, "a -> a"),
    ('start: a\na: ("(" | a) "x" | "y"\n', LeftRecursionError, "a -> a"),
    ('start: a\na: a "x"\n', LeftRecursionError, "no finite text"),
    ("start: _sep{a}\n", UnsupportedGrammarError, "template"),
    ("%declare X\nstart: X\n", UnsupportedGrammarError, "%declare"),
    ('start: "a"\n%override start: "b"\n', UnsupportedGrammarError, "%override"),
    ("start: X\n%import python.X\n", UnsupportedGrammarError, "only Lark's `common`"),
    ("start: /a(?=b)/\n", UnsupportedGrammarError, "look-around"),
    ("start: /^a/\n", UnsupportedGrammarError, "anchors"),
    ("start: /(a)\\1/\n", UnsupportedGrammarError, "back-references"),
    ("start: /a/l\n", UnsupportedGrammarError, "flag"),
    ("start: /a(/\n", UnsupportedGrammarError, "not a valid Python regex"),
    ('start: A\nA: "a" A?\n', UnsupportedGrammarError, "refers to itself"),
    ('start: A\nA: "a" b\nb: "b"\n', UnsupportedGrammarError, "terminals may use only terminals"),
    ('start: "a" | b\nb: "x" b\n', UnsatisfiableSchemaError, "derive no finite text"),
])
def test_refusals_are_typed_and_name_the_problem(grammar, error, words):
    with pytest.raises(error, match=None) as info:
        compile_lark(grammar)
    assert words in str(info.value)
    assert isinstance(info.value, SchemaError)
    if error not in (UnsatisfiableSchemaError,):
        assert isinstance(info.value, GrammarError)


def test_grammars_over_budget_are_refused_by_a_count():
    doubling = "start: A0\n" + "".join(f"A{i}: A{i + 1} A{i + 1}\n" for i in range(30)) + 'A30: "ab"\n'
    with pytest.raises(SchemaTooComplexError, match="max_text"):
        compile_lark(doubling)  # 2^30 copies: refused after ~10M characters written, not built
    with pytest.raises(SchemaTooComplexError, match="max_text"):
        compile_lark(SQL, budget=CompileBudget(max_text=500))
    compile_lark(SQL, budget=CompileBudget(max_text=500_000))


def test_syntax_reader_reads_continuations_comments_and_imports():
    grammar = parse_lark(
        "start: a   // a comment\n"
        "     | b   # another\n"
        "\n"
        "     | c\n"
        'a: "a"\nb: "b"\nc: "c"\n'
        "%import common (WS, INT)\n%import common.CNAME -> NAME\n%ignore WS\n")
    assert len(grammar.rules["start"].body.items) == 3
    assert [(i.name, i.alias) for i in grammar.imports] == [("WS", "WS"), ("INT", "INT"), ("CNAME", "NAME")]
    assert len(grammar.ignores) == 1


@pytest.mark.parametrize(("max_ignored", "text", "accepted"), [
    (None, "a ,   b", True), (1, "a , b", True), (1, "a ,  b", False), (1, " a", True), (1, "  a", False),
    (0, "a,b", True), (0, "a ,b", False), (2, " a  ,  b  ", True), (2, "a   ,b", False),
])
def test_ignored_text_between_tokens_is_bounded_by_max_ignored(max_ignored, text, accepted):
    grammar = 'start: WORD ("," WORD)*\nWORD: /[a-z]+/\n%ignore " "\n'
    dfa = build_automaton(compile_lark(grammar, max_ignored=max_ignored).constraint)
    assert dfa.accepts(text.encode()) == accepted


@pytest.mark.parametrize(("max_ignored", "text", "accepted"), [
    (None, "a ,  \n\n  b", True), (1, "a , b", True), (1, "a ,\nb", True), (1, "a,\r\nb", True),
    (1, "a ,  b", False), (1, "a ,\n\nb", False), (1, "a,\n  b", False), (2, "a\n ,b", True), (2, "a   ,b", False),
])
def test_a_whitespace_run_counts_its_characters(max_ignored, text, accepted):
    """`%ignore WS` (Lark's usual idiom) matched a whole run at once: one match let a model write whitespace
    until `max_new_tokens`. Under a bound, each character (or \\r\\n) is a match."""
    grammar = 'start: WORD ("," WORD)*\nWORD: /[a-z]+/\n%import common.WS\n%ignore WS\n'
    dfa = build_automaton(compile_lark(grammar, max_ignored=max_ignored).constraint)
    assert dfa.accepts(text.encode()) == accepted


@pytest.mark.parametrize(("pattern", "unit"), [
    (r"[ \t\f\r\n]+", r"(?: |\t|\n|\r\n|\r|\f)"), (r"[ \t]+", r"(?: |\t)"), (r"\s+", r"(?: |\t|\n|\r\n|\r|\f|\v)"),
    (r"(\r?\n)+", r"(?:\n|\r\n)"), (" ", None), (r"#[^\n]*", None), (r"[^a]+", None), ("[ ]{2}", None),
    (r"[\x{20}\t]+", None),  # Rust's braced escape, which Python's re does not read: left as written, no error
])
def test_only_unbounded_whitespace_patterns_are_cut(pattern, unit):
    from hf_paged.processors.lark.compile import _whitespace_unit

    assert _whitespace_unit(pattern) == unit  # comments, bounded and non-whitespace patterns are left as written


def test_the_processor_bounds_ignored_text_by_default():
    from hf_paged.processors import GrammarLogitsProcessor
    from tests.processors.toy_tokenizers import byte_level_tokenizer

    tok = byte_level_tokenizer()
    grammar = 'start: WORD ("," WORD)*\nWORD: /[a-z]+/\n%ignore " "\n'
    assert GrammarLogitsProcessor(grammar, tok).max_ignored == 1  # one space at most between tokens
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="max_ignored"):
            GrammarLogitsProcessor(grammar, tok, max_ignored=bad)
