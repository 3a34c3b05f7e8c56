"""Free-form key states from a plan (`closed_states`), narrow states by the marking walk, and stops followed on call
stacks (`past_stops`): each checked against the plain walk of the grammar's own automaton."""

from __future__ import annotations

import random

import numpy as np

from hf_paged.processors.automaton.grammar_dfa import GrammarDFA
from hf_paged.processors.index.closed_states import closed_states
from hf_paged.processors.index.token_index import TokenIndex
from hf_paged.processors.index.token_trie import build_token_trie
from hf_paged.processors.index.token_walk import TrieWalk
from hf_paged.processors.schema import schema_to_grammar
from tests.processors.test_grammar_dfa import walk_in_lockstep
from tests.processors.test_token_index import make_vocab


def _closed_by_search(table: np.ndarray, inside: np.ndarray, dead: int, body: list[int]) -> np.ndarray:
    """The definition: every state reached from s by body bytes is inside, and sends every body byte to a live
    inside state."""
    ok = np.array([
        s != dead and inside[s] and all(table[s, b] != dead and inside[table[s, b]] for b in body)
        for s in range(table.shape[0])
    ])
    closed = np.zeros(table.shape[0], dtype=bool)
    for start in range(table.shape[0]):
        seen, stack = {start}, [start]
        while stack:
            state = stack.pop()
            for b in body:
                following = int(table[state, b])
                if following not in seen:
                    seen.add(following)
                    stack.append(following)
        closed[start] = all(ok[s] for s in seen)
    return closed


def test_closed_states_are_the_greatest_fixed_point():
    rng = np.random.default_rng(7)
    body = [0x61, 0x62, 0x63]  # "abc"
    bits = sum(1 << b for b in body)
    for _ in range(200):
        size = int(rng.integers(2, 12))
        dead = size - 1
        table = np.full((size, 256), dead, dtype=np.int32)
        # body bytes mostly stay among the first states (a closed core), sometimes to the dead or a stop state
        table[:, body] = rng.integers(0, size, (size, len(body)))
        table[dead] = dead
        inside = rng.random(size) < 0.85
        inside[dead] = True
        got = closed_states(table, inside, dead, bits)
        assert got.tolist() == _closed_by_search(table, inside, dead, body).tolist()


def _lockstep(grammar: str, vocab, limit: int) -> int:
    """The grammar's index with every fast path on, against its plain walk (every state node by node in Python,
    no plans, no compiled narrow walk) on a second automaton: the same masks, moves and finals."""
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    plain = TokenIndex(GrammarDFA(grammar), vocab, trie, narrow_bytes=256)
    plain._walk.use_bodies = False
    plain._walk.compiled_narrow = False
    return walk_in_lockstep(plain, TokenIndex(GrammarDFA(grammar), vocab, trie), vocab, limit)


KEY_TOKENS = [b'"', b'":', b'":"', b'":{"', b'":[', b'":[{"', b'":1', b'":1}', b'":""},{"', b'"},', b'":"",',
              b'na', b'nam', b'me', b'me":', b'xy', b'name', b'\\"', b'\xc3\xa9', b'"}', b'":{}}']


def test_free_form_keys_match_the_plain_walk(monkeypatch):
    # undeclared keys beside declared names that share prefixes: every prefix of a key is a state of its own, and
    # their masks come from the key-body plan plus the listed tokens, walked on past the value's call
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "nap": {"type": "integer"},
                                               "b": {"type": "object", "properties": {"c": {"type": "boolean"}}}}}
    grammar = schema_to_grammar(schema, undeclared_keys=True)
    vocab = make_vocab([bytes([b]) for b in range(256)] + KEY_TOKENS)
    planned = []
    original = TrieWalk.closed_planned

    def counting(self, state):
        found = original(self, state)
        planned.append(found is not None)
        return found

    monkeypatch.setattr(TrieWalk, "closed_planned", counting)
    compared = _lockstep(grammar, vocab, limit=500)
    assert compared > 200
    assert sum(planned) >= 4  # key states went through the plan


def test_stops_followed_on_call_stacks_agree_with_the_automaton():
    # from every stop state met (calls into the free value, finished callees), random continuations: the stacks
    # followed on the rules' own tables say alive exactly when the automaton does
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}}}
    grammar = schema_to_grammar(schema, undeclared_keys=True)
    vocab = make_vocab([bytes([b]) for b in range(256)])
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    index = TokenIndex(GrammarDFA(grammar), vocab, trie)
    dfa, walk = index.dfa, index._walk
    rng = random.Random(3)
    alphabet = b'{}[]":,01a -'
    # (undeclared keys come after the declared ones, see `schema.objects`)
    documents = [b'{"a":[{"x":{"y":[1,{"z":"w"}]}},{}],"q":[[]]}', b'{"a":[],"k":{"l":{"m":[-1,"n",{"o":{}}]}}}']
    checked = 0
    for document in documents:
        state = dfa.initial
        for byte in document:
            dfa.ensure_one(state)
            frames = dfa.frames(state)
            if frames is not None and dfa.inside_view(state) is None:  # a stop
                for _ in range(25):
                    rest = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
                    assert walk.stops.alive(state, rest) == (walk.next_state(state, rest) is not None), rest
                    checked += 1
            state = walk.next_state(state, bytes([byte]))
            assert state is not None
    assert checked > 100
