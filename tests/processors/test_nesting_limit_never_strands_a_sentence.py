"""Near the call stacks' nesting limit (`MAX_DEPTH` frames) every state offered can still end (h4 G2): with
`start: "(" start ")" | "x"` the 127th `(` was offered, though from there the only way on was a call the limit
refuses; a model that took it could only stop unfinished ("stop_incomplete", Lark: UnexpectedEOF), and the log
blamed a vocabulary without byte fallback. Now the deepest frames keep only what ends within the limit: there `x`
(or the closing bracket) is the only byte left."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessor

from hf_paged.processors import GrammarLogitsProcessor
from hf_paged.processors.automaton import build_automaton
from hf_paged.processors.index.token_index import TokenIndex
from hf_paged.processors.index.token_trie import build_token_trie
from hf_paged.processors.lark.compile import compile_lark
from tests.processors.test_token_index import EOS, make_vocab
from tests.processors.toy_tokenizers import byte_level_tokenizer

GRAMMARS = [  # (grammar, the byte that opens a level, the bytes allowed at the deepest one, most levels)
    ('start: "(" start ")" | "x"', "(", ["x"], 126),
    ('start: a\na: "(" b ")" | "x"\nb: a ("," a)*', "(", ["x"], 63),  # two frames a level
    ('start: "[" start? "]"', "[", ["]"], 127),  # an optional call: closing is always possible
]


def _can_end(dfa, state: int) -> bool:
    seen, pending = {state}, deque([state])
    while pending:
        current = pending.popleft()
        dfa.ensure_one(current)
        if dfa.finals[current]:
            return True
        for following in set(dfa.transitions[current].tolist()) - {dfa.dead} - seen:
            seen.add(following)
            pending.append(following)
    return False


@pytest.mark.parametrize("grammar,opener,last,levels", GRAMMARS)
def test_every_state_down_to_the_limit_can_end(grammar, opener, last, levels):
    dfa = build_automaton(compile_lark(grammar).constraint)
    state, opened = dfa.initial, 0
    while True:
        dfa.ensure_one(state)
        following = int(dfa.transitions[state, ord(opener)])
        if following == dfa.dead:
            break
        state, opened = following, opened + 1
        assert _can_end(dfa, state), opened
    assert opened == levels
    assert [chr(b) for b in range(256) if dfa.transitions[state, b] != dfa.dead] == last
    closing = {"(": ")", "[": "]"}[opener] * opened
    assert dfa.accepts((opener * opened + ("x" if last == ["x"] else "") + closing).encode())


@pytest.mark.parametrize("compiled_narrow", [True, False])
def test_tokens_of_several_openers_stop_at_the_limit_too(compiled_narrow):
    # tokens that cross several calls at once obey the same limit: followed on call stacks past a rule's stop
    # (`past_stops`, the compiled narrow walk) or on the automaton's rows (the Python walk)
    vocab = make_vocab([b"(", b"((", b"((((", b"x", b")", b"))", b"x)", b"(x"])
    grammar = compile_lark('start: "(" start ")" | "x"').constraint
    index = TokenIndex(build_automaton(grammar), vocab, build_token_trie(vocab.tokens, vocab.vocab_size))
    index._walk.compiled_narrow = compiled_narrow
    state, text = index.get_initial_state(), b""
    by_id = {ids[0]: raw for raw, ids in vocab.tokens.items()}
    while True:
        allowed = set(index.get_allowed_tokens(state)) - {EOS}
        openers = [t for t in allowed if by_id[t].strip(b"(") == b""]
        if not openers:
            break
        token = max(openers, key=lambda t: len(by_id[t]))  # the most "(" a token offers
        state, text = index.get_next_state(state, token), text + by_id[token]
    assert text == b"(" * 126 and {by_id[t] for t in set(index.get_allowed_tokens(state)) - {EOS}} == {b"x", b"x)"}


class Prefer(LogitsProcessor):
    """Push one token up (before the grammar's mask): a model that always opens another level when it may."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def __call__(self, input_ids, scores):
        scores[:, self.token_id] += 1e4
        return scores


def test_a_model_that_always_opens_still_ends_its_sentence():
    tok = byte_level_tokenizer()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=1, n_embd=16, n_head=2, n_positions=512,
                                       eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)).eval()
    proc = GrammarLogitsProcessor('start: "(" start ")" | "x"', tok)
    (opener,) = tok.encode("(", add_special_tokens=False)
    prompt = torch.tensor([[tok.eos_token_id]])
    out = model.generate(prompt, logits_processor=[Prefer(opener), proc], max_new_tokens=300, do_sample=False,
                         pad_token_id=tok.eos_token_id)
    ids = out[0, 1:].tolist()
    assert tok.eos_token_id in ids, "ran out of tokens"
    text = tok.decode(ids[: ids.index(tok.eos_token_id)])
    assert text == "(" * 126 + "x" + ")" * 126


def test_rests_past_a_stop_follow_the_limit():
    # `past_stops` decides a token's rest past a call on call stacks of its own: the same limit as the automaton's
    from hf_paged.processors.index.past_stops import GrammarStops

    dfa = build_automaton(compile_lark('start: "(" start ")" | "x"').constraint)
    stops, state = GrammarStops(dfa), dfa.initial
    states = []
    for _ in range(126):
        dfa.ensure_one(state)
        state = int(dfa.transitions[state, ord("(")])
        states.append(state)
    assert dfa.frames(states[-1]) is not None  # (a single call stack: the call state after the 126th "(")
    assert stops.alive(states[-1], b"x") and stops.alive(states[-1], b"x)")
    assert not stops.alive(states[-1], b"(")  # (the old closure kept a stack stuck at the limit: "alive")
    assert stops.alive(states[-2], b"(") and not stops.alive(states[-2], b"((")
    assert list(stops.rests_alive(np.array([states[-1], states[-2]]), [b"(", b"("])) == [False, True]
