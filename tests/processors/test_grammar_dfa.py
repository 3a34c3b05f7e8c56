"""Grammars (regex rules that call each other) as lazily built byte automata: the same token masks, moves and
finals as the flat regex with every call inlined, on hand-made and random grammars and on schemas."""

from __future__ import annotations

import json
import random
import re
import threading
import warnings
from collections import deque

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_paged.errors import SchemaTooComplexError
from hf_paged.processors.automaton import build_automaton
from hf_paged.processors.automaton.grammar import Grammar, call_regex, inline_grammar
from hf_paged.processors.automaton.grammar_dfa import MAX_DEPTH, GrammarDFA
from hf_paged.processors.index.index_cache import index_key
from hf_paged.processors.index.token_index import TokenIndex
from hf_paged.processors.index.token_trie import build_token_trie
from hf_paged.processors.index.vocabulary import TokenVocabulary
from hf_paged.processors.schema import schema_to_grammar, schema_to_regex
from hf_paged.processors.schema.context import Context
from hf_paged.processors.schema.translate import translate
from tests.processors.test_token_index import EOS, TOY, make_vocab

# narrow_bytes: the compiled walk for every state, mixed, the default (narrow states by the compiled walk on their
# rule's table), and node by node in Python (`PYTHON_WALK`: the compiled narrow walk off)
WALKS = [0, 4, 16, 256]
PYTHON_WALK = 256


def check_same_as_inlined(grammar: Grammar, vocab: TokenVocabulary, narrow_bytes: int, limit: int = 400,
                          use_bodies: bool = True) -> int:
    """Walk the grammar's index and the inlined regex's index in lockstep; returns the number of states compared
    (`use_bodies=False`: no string-body plans in the grammar's index, every wide state by its other paths)."""
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    flat = TokenIndex(build_automaton(inline_grammar(grammar)), vocab, trie, narrow_bytes=narrow_bytes)
    lazy = TokenIndex(GrammarDFA(grammar), vocab, trie, narrow_bytes=narrow_bytes)
    lazy._walk.use_bodies = use_bodies
    flat._walk.compiled_narrow = lazy._walk.compiled_narrow = narrow_bytes != PYTHON_WALK
    return walk_in_lockstep(flat, lazy, vocab, limit)


def walk_in_lockstep(reference: TokenIndex, index: TokenIndex, vocab: TokenVocabulary, limit: int) -> int:
    """Walk two indexes of one language in lockstep (breadth-first over the allowed tokens, at most `limit` state
    pairs): the same allowed tokens, finals, forced tokens and refusals everywhere. Returns the pairs compared."""
    start = (reference.get_initial_state(), index.get_initial_state())
    seen, queue = {start}, deque([start])
    while queue and len(seen) < limit:
        r_state, i_state = queue.popleft()
        expected = reference.get_allowed_tokens(r_state)
        assert index.get_allowed_tokens(i_state) == expected, (r_state, i_state)
        assert index.is_final_state(i_state) == reference.is_final_state(r_state)
        mask = index.state_mask(i_state)
        assert mask.num_allowed == len(expected)
        assert mask.forced == reference.state_mask(r_state).forced
        for token_id in expected:
            if token_id == EOS:
                continue
            pair = (reference.get_next_state(r_state, token_id), index.get_next_state(i_state, token_id))
            assert pair[1] is not None
            if pair not in seen:
                seen.add(pair)
                queue.append(pair)
        for refused in {1, 2, 3, 34, 300, vocab.vocab_size - 1} - set(expected):
            assert index.get_next_state(i_state, refused) is None
    return len(seen)


def schema_grammar(schema: dict) -> Grammar:
    """The schema's exact translation with every value of any size a rule (calls everywhere), declared keys only
    (undeclared keys take free values, a recursive rule that no flat regex inlines)."""
    ctx = Context(root=schema, translate=translate, rules={}, max_cost=400_000, min_rule_cost=0, undeclared_keys=False)
    rx = translate(schema, ctx, "#")
    assert ctx.rules, "the schema has values to call"
    return Grammar(rx.text, ctx.grammar_rules())


def test_call_text_and_grammar_value():
    assert call_regex(1) == "\\x02\\x0e\\x0e\\x0f"
    assert re.fullmatch(call_regex(18 * 18 + 2), "\x02\x0f\x0e\x10")
    text = Grammar(f"a{call_regex(1)}c", [f"b{call_regex(2)}", "d|e"])
    assert text.texts == (f"a{call_regex(1)}c", f"b{call_regex(2)}", "d|e")
    assert text == Grammar(text.root, tuple(text.rules)) and hash(text) == hash(Grammar(text.root, text.rules))
    assert index_key("k", text, None, "f") == index_key("k", Grammar(text.root, text.rules), None, "f")
    assert index_key("k", text, None, "f") != index_key("k", Grammar(text.root, ("b", "d|e")), None, "f")
    assert not isinstance("a|b", Grammar) and inline_grammar("a|b") == "a|b"
    assert re.fullmatch(inline_grammar(text), "abec") and not re.fullmatch(inline_grammar(text), "abc")
    with pytest.raises(ValueError, match="out of range"):
        call_regex(0)


def test_byte_walk_follows_calls_and_returns():
    # root: x then rule 1 or rule 2 (both start with "{": two configurations at once), then "!"
    text = Grammar(f"x(?:{call_regex(1)}|{call_regex(2)})!", ['\\{a\\}', '\\{a?b\\}'])
    dfa = GrammarDFA(text)

    assert [dfa.accepts(d) for d in (b"x{a}!", b"x{b}!", b"x{ab}!", b"x{a}", b"x{}!", b"x{a}!!")] == [
        True, True, True, False, False, False]
    assert not dfa.finals[dfa.initial] and dfa.dead == 0 and dfa.initial == 1


def test_unknown_rule_and_capacity_are_clear_errors():
    with pytest.raises(ValueError, match="calls rule 3"):
        GrammarDFA(Grammar(f"a{call_regex(3)}", ["b"]))
    dfa = GrammarDFA(Grammar(f"(?:{call_regex(1)})*", ["[a-z]{0,40}"]), capacity=16)
    with pytest.raises(SchemaTooComplexError, match="more than 16 states"):
        state = dfa.initial
        for byte in b"abcdefghijklmnopqrstuvwxyz":
            dfa.ensure_one(state)
            state = int(dfa.transitions[state, byte])


# (rules never match raw control bytes, as JSON text never holds them: 0x02 and 0x0E..0x1F spell calls)
ATOMS = st.sampled_from(["a", "b", "1", "[0-9]", '[^"\\x00-\\x1f]', '"', "é", " ", "name", "\\{", "\\}"])


def _regexes(calls: list[str]) -> st.SearchStrategy[str]:
    atoms = st.one_of(ATOMS, st.sampled_from(calls)) if calls else ATOMS

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda p: f"(?:{p[0]}|{p[1]})"),
            st.tuples(inner, st.sampled_from(["?", "*", "{0,2}"])).map(lambda p: f"(?:{p[0]}){p[1]}"),
        )

    return st.recursive(atoms, extend, max_leaves=5)


@settings(max_examples=40, deadline=None)
@given(_regexes([call_regex(1), call_regex(2)]), _regexes([call_regex(2)]), _regexes([]))
def test_random_grammars_match_their_inlined_regex(root, rule1, rule2):
    grammar = Grammar(root, [rule1, rule2])
    for narrow_bytes in WALKS:
        check_same_as_inlined(grammar, TOY, narrow_bytes, limit=120)
    check_same_as_inlined(grammar, TOY, 0, limit=120, use_bodies=False)  # wide states by lookahead classes


def test_states_of_several_stacks_take_the_union_of_their_members_masks():
    # both rules start with "a": after it the automaton holds two call stacks at once (a set state), whose mask is
    # the union of its members' (one rule allows "b" next, the other "c" or a short string body)
    grammar = Grammar(f"(?:{call_regex(1)}|{call_regex(2)})x?", ["ab", 'a(?:c|[^"\\x00-\\x1f]{0,3})'])
    lazy = TokenIndex(GrammarDFA(grammar), TOY, build_token_trie(TOY.tokens, TOY.vocab_size))
    after_a = lazy.get_next_state(lazy.get_initial_state(), TOY.tokens[b"a"][0])
    members = lazy.dfa.set_members(after_a)
    assert members is not None and len(members) == 2
    union = set().union(*(lazy.get_allowed_tokens(member) for member in members))
    assert lazy.get_allowed_tokens(after_a) == sorted(union)
    for narrow_bytes in WALKS:
        assert check_same_as_inlined(grammar, TOY, narrow_bytes) > 5


SCHEMAS = {
    "nested optional objects": {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string", "maxLength": 4}}},
            "b": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}},
                                             "required": ["x"]}},
            "c": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    },
    "alternatives that start alike": {
        "anyOf": [
            {"type": "object", "properties": {"k": {"type": "string", "enum": ["é", "e"]}}, "required": ["k"]},
            {"type": "object", "properties": {"k": {"type": "integer"}, "m": {"type": "boolean"}}},
        ]
    },
    "shared ref": {
        "$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer"}, "w": {"type": "string"}}}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/leaf"}, "b": {"type": "array", "items": {"$ref": "#/$defs/leaf"}}},
    },
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_schema_grammars_match_the_flat_regex(name):
    grammar = schema_grammar(SCHEMAS[name])
    assert len(grammar.texts) > 2
    for narrow_bytes in WALKS:
        assert check_same_as_inlined(grammar, TOY, narrow_bytes) > 15


def test_string_bodies_in_rules_use_the_planned_masks():
    # counted and plain string bodies inside called rules, with tokens that cross a rule's end ('"}')
    vocab = make_vocab([bytes([b]) for b in range(256)] + [b'"}', b'"},', b'":"', b'ab', b'abcd', b'\xc3\xa9'])
    schema = {"type": "array", "items": {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 6}, "t": {"type": "string"}}, "required": ["s"]}}
    grammar = schema_grammar(schema)
    assert check_same_as_inlined(grammar, vocab, 16, limit=600) > 40


def _nested_schema(width: int, depth: int) -> dict:
    """`depth` levels of objects with `width` optional members each: the flat regex doubles per level."""
    leaf = {"type": "string", "maxLength": 40}
    node: dict = leaf
    for level in range(depth):
        node = {"type": "object", "properties": {f"k{level}_{i}": node for i in range(width)}}
    return node


def test_schema_to_grammar_keeps_what_the_flat_budget_leaves_out():
    schema = _nested_schema(width=4, depth=3)
    with warnings.catch_warnings(record=True) as flat_warnings:
        warnings.simplefilter("always")
        flat = schema_to_regex(schema, max_cost=20_000, undeclared_keys=False)
    assert any("left out" in str(w.message) for w in flat_warnings)  # the flat regex had to shrink
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the grammar is exact: no warning
        grammar = schema_to_grammar(schema, max_cost=20_000, undeclared_keys=False)
    assert isinstance(grammar, Grammar)
    rules = grammar.texts
    assert 1 < len(rules) < 10  # each level's value is one rule, shared by its 4 uses
    deep = {"k2_0": {"k1_2": {"k0_1": "é"}}, "k2_3": {"k1_0": {}, "k1_3": {"k0_3": "x" * 40}}}  # (schema order)
    text = json.dumps(deep, separators=(",", ":"), ensure_ascii=False)
    assert re.fullmatch(inline_grammar(grammar), text) and not re.fullmatch(flat, text)
    assert GrammarDFA(grammar).accepts(text.encode())
    assert schema_to_grammar({"type": "integer"}) == schema_to_regex({"type": "integer"})  # small: flat


def test_flat_tries_set_aside_for_grammars_stop_at_their_first_cut(monkeypatch):
    """A flat try that leaves anything out only waits behind the exact grammars: translating it stops at its first
    cut, here the undeclared keys of the open root object (a free value, nested only so deep when flat) before
    any of its members. The grammar is the result all the same; the fallback is translated in full only when no
    grammar fits."""
    from hf_paged.processors.schema import ladder

    visits: list[tuple[bool, int]] = []  # (flat, sub-schemas visited) per try

    def counting(schema, ctx, pointer):
        try:
            return translate(schema, ctx, pointer)
        finally:
            if pointer == "#":
                visits.append((ctx.rules is None, ctx.num_visits))

    monkeypatch.setattr(ladder, "translate", counting)
    wide = {"type": "object", "properties": {
        f"k{i}": {"type": "object", "properties": {"v": {"type": "string"}}, "additionalProperties": False}
        for i in range(40)}}
    grammar = schema_to_grammar(wide)
    assert isinstance(grammar, Grammar)
    assert [n for flat, n in visits if flat] == [1]  # the root object only (the later flat tries cut as much)
    assert [n > 80 for flat, n in visits if not flat] == [True]  # the grammar visits every member's value


def test_when_no_grammar_fits_the_flat_try_that_cut_is_translated_in_full(monkeypatch):
    from hf_paged.processors.schema import context

    schema = {"type": "object", "properties": {"a": {}, "b": {"type": "integer"}}}  # open, with a free value
    monkeypatch.setattr(context, "MAX_RULES", 1)  # every grammar try fails (too many rules)
    flat = schema_to_grammar(schema)
    assert flat == schema_to_regex(schema)  # the first flat try: undeclared keys, free values nested 2 deep
    assert re.fullmatch(flat, '{"a":{"x":1},"b":2,"c":{}}') and not re.fullmatch(flat, '{"a":{"x":[1]}}')


RECURSIVE = {
    "$defs": {"node": {"type": "object", "properties": {"v": {}, "next": {"$ref": "#/$defs/node"}},
                       "required": ["v"], "additionalProperties": False}},
    "$ref": "#/$defs/node",
}


def _random_documents(index: TokenIndex, vocab: TokenVocabulary, num: int, max_tokens: int) -> list[bytes]:
    """Texts of random token walks that ended with EOS (uniform over allowed tokens, EOS taken when allowed)."""
    rng = random.Random(0)
    done = []
    for _ in range(num):
        state, text = index.get_initial_state(), b""
        for _ in range(max_tokens):
            allowed = index.get_allowed_tokens(state)
            if EOS in allowed and (len(allowed) == 1 or rng.random() < 0.5):
                done.append(text)
                break
            token_id = rng.choice([t for t in allowed if t != EOS])
            text += index.trie.token_bytes[token_id]
            state = index.get_next_state(state, token_id)
    return done


def test_recursive_refs_and_free_values_are_rules_that_call_themselves():
    ctx = Context(root=RECURSIVE, translate=translate, rules={}, min_rule_cost=0)
    rx = translate(RECURSIVE, ctx, "#")
    grammar = Grammar(rx.text, ctx.grammar_rules())
    assert set(ctx.ref_rules) == {"#/$defs/node", "#any"}
    with pytest.raises(ValueError, match="recursive"):
        inline_grammar(grammar)
    dfa = GrammarDFA(grammar)

    def accepts(doc: object) -> bool:
        return dfa.accepts(json.dumps(doc, separators=(",", ":")).encode())

    deep: dict = {"v": [[[[{"x": [1, {"y": None}]}]]]]}
    for level in range(20):  # far past max_ref_depth (3) and the flat free value's two levels
        deep = {"v": level, "next": deep}
    assert accepts(deep)
    assert not accepts({"v": 1, "next": {"next": {"v": 2}}})  # a missing `v` deep down
    assert not accepts({"v": 1, "next": {"v": 2, "x": 3}})
    trie = build_token_trie(TOY.tokens, TOY.vocab_size)
    texts = _random_documents(TokenIndex(dfa, TOY, trie), TOY, num=40, max_tokens=150)
    assert len(texts) >= 10
    for text in texts:
        jsonschema.validate(json.loads(text), RECURSIVE)


def test_grammar_stack_depth_is_capped():
    # a rule that calls itself once per "[": MAX_DEPTH levels open, the next is refused (sound: a subset)
    grammar = Grammar(call_regex(1), [f"\\[(?:{call_regex(1)})?\\]"])
    dfa = GrammarDFA(grammar)
    state = dfa.initial
    for depth in range(MAX_DEPTH + 1):
        dfa.ensure_one(state)
        state = int(dfa.transitions[state, ord("[")])
        if state == dfa.dead:
            break
    assert depth == MAX_DEPTH - 1


def test_masks_shared_across_contexts_equal_each_contexts_own():
    # rule 1 (a quoted word, then digits) is called from two members: its first-letter state is wide, so (string-body
    # plans off) its second context takes its mask from the first one's walk of the rule (plus its own crossings)
    word = '"[a-z]{1,2}[0-9]{0,2}"'
    grammar = Grammar(f'\\{{"a":{call_regex(1)}(?:,"b":{call_regex(1)})?\\}}', [word])
    vocab = make_vocab([bytes([b]) for b in range(256)] + [b'a"', b'ab', b'a1"', b'b"}', b'7",', b'",', b'"}'])
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    flat = TokenIndex(build_automaton(inline_grammar(grammar)), vocab, trie)
    lazy = TokenIndex(GrammarDFA(grammar), vocab, trie)
    lazy._walk.use_bodies = False  # (no string-body plans: every wide state goes through the shared path)
    for text in (b'{"a":"', b'{"a":"x1","b":"'):  # the word's first letter, in its two contexts
        f_state, l_state = flat.get_initial_state(), lazy.get_initial_state()
        for byte in text:
            f_state = flat.get_next_state(f_state, byte + 1)  # (token id = byte + 1 for single bytes)
            l_state = lazy.get_next_state(l_state, byte + 1)
        assert lazy.get_allowed_tokens(l_state) == flat.get_allowed_tokens(f_state)
    assert len(lazy._grammar._walks) == 1  # one walk of the rule served both contexts
    assert check_same_as_inlined(grammar, vocab, 16) > 20
    assert check_same_as_inlined(grammar, vocab, 16, use_bodies=False) > 20


def test_counted_states_share_one_walk_per_lookahead_class():
    # a counted run of letters and spaces (<= 40) in a rule called from two members: decoding meets a new rule state
    # per count, but states far from the bound are one lookahead class; tokens longer than the lookahead (20 "a",
    # 18 spaces, and one crossing the rule's end) are walked per state
    body = '"[a-z ]{0,40}"'
    grammar = Grammar(f'\\{{"a":{call_regex(1)}(?:,"b":{call_regex(1)})?\\}}', [body])
    long_tokens = [b"a" * 20, b" " * 18, b"b" * 17 + b'",', b"c" * 17 + b'"}']
    vocab = make_vocab([bytes([b]) for b in range(256)] + [b"ab", b" a", b'a"', b'",', b'"}'] + long_tokens)
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    assert check_same_as_inlined(grammar, vocab, 16, limit=600, use_bodies=False) > 80
    lazy = TokenIndex(GrammarDFA(grammar), vocab, trie)
    lazy._walk.use_bodies = False
    state = lazy.get_initial_state()
    for token in [b'{"a":"'[i:i + 1] for i in range(6)] + [b"a" * 20, b"ab", b" a"]:
        lazy.get_allowed_tokens(state)
        state = lazy.get_next_state(state, vocab.tokens[token][0])
    assert lazy.get_next_state(state, vocab.tokens[b'",'][0]) is not None
    assert lazy.get_next_state(state, vocab.tokens[b"a" * 20][0]) is None  # 24 + 20 > 40
    assert lazy.get_next_state(state, vocab.tokens[b" " * 18][0]) is None  # 24 + 18 > 40
    assert len(lazy._grammar._walks) < 3  # 3 wide states met, far from the bound: fewer walks


def test_rule_facts_prepared_ahead_or_beside_decoding_give_the_same_masks():
    # `TokenIndex.prepare` (IndexCache runs it in its background thread once the index is published) computes every
    # rule's lookahead classes, closed key states and string-body ends; decoding computes on first need what is not
    # there yet. Prepared first, prepared in another thread while decoding walks, or never: the same masks
    body = '"[a-z ]{0,40}"'
    grammar = Grammar(f'\\{{"a":{call_regex(1)}(?:,"b":{call_regex(1)})?,"c":{call_regex(2)}\\}}',
                      [body, '"[a-z]{0,8}"'])
    vocab = make_vocab([bytes([b]) for b in range(256)] + [b"ab", b" a", b'a"', b'",', b'"}', b"a" * 20])
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    flat = TokenIndex(build_automaton(inline_grammar(grammar)), vocab, trie)
    ahead = TokenIndex(GrammarDFA(grammar), vocab, trie)
    ahead.prepare()
    assert {rule for rule, _ in ahead._grammar._classes} == {1, 2}  # (the root's states are all narrow here)
    assert walk_in_lockstep(flat, ahead, vocab, 400) > 80
    beside = TokenIndex(GrammarDFA(grammar), vocab, trie)
    preparing = threading.Thread(target=beside.prepare)
    preparing.start()
    assert walk_in_lockstep(flat, beside, vocab, 400) > 80
    preparing.join()
    assert check_same_as_inlined(grammar, vocab, 16, limit=400) > 80  # (never prepared)


def test_class_walks_past_their_memory_budget_are_dropped_oldest_first(monkeypatch):
    from hf_paged.processors.index import grammar_masks

    monkeypatch.setattr(grammar_masks, "MAX_WALK_BYTES", 1)  # every new walk evicts the one before
    grammar = Grammar(f'\\{{"a":{call_regex(1)}(?:,"b":{call_regex(1)})?\\}}', ['"[a-z ]{0,40}"'])
    vocab = make_vocab([bytes([b]) for b in range(256)] + [b"ab", b" a", b'a"', b'",', b'"}', b"a" * 20])
    assert check_same_as_inlined(grammar, vocab, 16, limit=300, use_bodies=False) > 80
    lazy = TokenIndex(GrammarDFA(grammar), vocab, build_token_trie(vocab.tokens, vocab.vocab_size))
    lazy._walk.use_bodies = False
    state = lazy.get_initial_state()
    for token in [b'{"a":"'[i:i + 1] for i in range(6)] + [b"a" * 20] * 2:
        lazy.get_allowed_tokens(state)
        state = lazy.get_next_state(state, vocab.tokens[token][0])
    assert len(lazy._grammar._walks) == 1
