"""Stock-generate contract, exact masks: per-row state, reuse across calls, several EOS ids, padded width."""

from __future__ import annotations

import pytest
import torch

from hf_paged.errors import InvalidRegexError
from hf_paged.processors import ChoiceLogitsProcessor, RegexLogitsProcessor
from tests.processors.toy_tokenizers import byte_level_tokenizer

TOK = byte_level_tokenizer()
V = TOK.get_vocab()
EOS, END, PAD = V["<eos>"], V["<|end|>"], V["<pad>"]
ONE, TWO, X, DOT, TWELVE = V["1"], V["2"], V["x"], V["."], V["12"]


def allowed(scores: torch.Tensor) -> list[list[int]]:
    return [(row != float("-inf")).nonzero().flatten().tolist() for row in scores]


def test_rows_keep_their_own_state_and_eos_mirrors_every_id():
    proc = ChoiceLogitsProcessor(["12", "1x"], TOK, eos_token_id=[EOS, END])
    prompt = torch.tensor([[5, 6], [7, 8]])
    assert allowed(proc(prompt, torch.zeros(2, 279))) == [[ONE, TWELVE]] * 2
    step = torch.cat([prompt, torch.tensor([[ONE], [TWELVE]])], dim=1)
    assert allowed(proc(step, torch.zeros(2, 279))) == [sorted([TWO, X]), [EOS, END]]
    step = torch.cat([step, torch.tensor([[X], [EOS]])], dim=1)
    # row 0 completed "1x": only the EOS ids; row 1 emitted EOS: stays EOS-only (its pad tokens are ignored)
    assert allowed(proc(step, torch.zeros(2, 279))) == [[EOS, END], [EOS, END]]
    step = torch.cat([step, torch.tensor([[EOS], [PAD]])], dim=1)
    assert allowed(proc(step, torch.zeros(2, 279))) == [[EOS, END], [EOS, END]]


def test_reused_across_calls_and_batch_sizes():
    proc = ChoiceLogitsProcessor(["12", "1x"], TOK)
    proc(torch.tensor([[5]]), torch.zeros(1, 279))
    proc(torch.tensor([[5, ONE]]), torch.zeros(1, 279))
    # a new generate call: same batch size, a prompt that is not "previous ids + 1 token" -> fresh documents
    assert allowed(proc(torch.tensor([[9, 9, 9]]), torch.zeros(1, 279))) == [[ONE, TWELVE]]
    # another call with a bigger batch
    assert allowed(proc(torch.tensor([[1], [2], [3]]), torch.zeros(3, 279))) == [[ONE, TWELVE]] * 3
    # same length + 1 but different history: also a new call
    assert allowed(proc(torch.tensor([[7, ONE], [2, ONE], [3, ONE]]), torch.zeros(3, 279))) == [[ONE, TWELVE]] * 3


def test_padded_logits_width_and_specials_are_masked():
    proc = RegexLogitsProcessor(r"[0-9]+", TOK)
    scores = proc(torch.tensor([[5]]), torch.zeros(1, 300))  # 21 padded embedding rows beyond the tokenizer
    digits = sorted(V[str(d)] for d in range(10)) + [TWELVE]
    assert allowed(scores) == [digits]
    assert torch.isinf(scores[0, 279:]).all() and scores[0, PAD] == float("-inf")


def test_number_may_continue_after_a_complete_prefix():
    # outlines-core 0.2.14 alone refuses "." after "1" (its delayed-match bug); anchoring fixes it
    proc = RegexLogitsProcessor(r"[0-9]+(\.[0-9]+)?", TOK)
    proc(torch.tensor([[5]]), torch.zeros(1, 279))
    after_one = allowed(proc(torch.tensor([[5, ONE]]), torch.zeros(1, 279)))[0]
    assert DOT in after_one and EOS in after_one and ONE in after_one
    after_dot = allowed(proc(torch.tensor([[5, ONE, DOT]]), torch.zeros(1, 279)))[0]
    assert EOS not in after_dot and DOT not in after_dot and ONE in after_dot


def test_refused_token_ends_the_document():
    proc = ChoiceLogitsProcessor(["12"], TOK)
    proc(torch.tensor([[5]]), torch.zeros(1, 279))
    # another processor forced "x": the automaton refuses it; the row may then only end
    assert allowed(proc(torch.tensor([[5, X]]), torch.zeros(1, 279))) == [[EOS]]


def test_whitespace_is_bounded_by_default_and_configurable():
    from hf_paged.processors import JSONSchemaLogitsProcessor

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    space, two_spaces, brace = V["Ġ"], V["ĠĠ"], V["{"]
    bounded = JSONSchemaLogitsProcessor(schema, TOK)
    after_brace = allowed(bounded.process_rows(["r"], [[brace]], torch.zeros(1, 279)))[0]
    assert space in after_brace and two_spaces not in after_brace
    after_space = allowed(bounded.process_rows(["r"], [[brace, space]], torch.zeros(1, 279)))[0]
    assert space not in after_space and V['"'] in after_space
    loose = JSONSchemaLogitsProcessor(schema, TOK, whitespace="[ ]{0,4}")
    after_space = allowed(loose.process_rows(["r"], [[brace, space]], torch.zeros(1, 279)))[0]
    assert space in after_space and two_spaces in after_space
    for other in ("x", "a|", '"?', ",?", "\\s*", "."):  # anything but JSON whitespace made documents that do not parse
        with pytest.raises(InvalidRegexError, match="no JSON whitespace"):
            JSONSchemaLogitsProcessor(schema, TOK, whitespace=other)


def test_reordered_rows_follow_their_own_history():
    # beam search reorders rows between steps: each row's state must follow the tokens of that row
    proc = ChoiceLogitsProcessor(["1x2", "x12"], TOK)
    proc(torch.tensor([[5], [5]]), torch.zeros(2, 279))
    proc(torch.tensor([[5, ONE], [5, X]]), torch.zeros(2, 279))
    # rows swapped their histories: row 0 is now "x1", row 1 "1x"; each needs "2" (a stale state would refuse)
    swapped = torch.tensor([[5, X, ONE], [5, ONE, X]])
    assert allowed(proc(swapped, torch.zeros(2, 279))) == [[TWO], [TWO]]
    assert allowed(proc(torch.cat([swapped, torch.tensor([[TWO], [TWO]])], 1), torch.zeros(2, 279))) == [[EOS]] * 2


def test_cpu_id_path_equals_the_bitmask_path_and_fills_the_bitmask():
    # a string body (few banned ids) and structural states (few allowed), logits wider than the vocabulary
    fast = RegexLogitsProcessor(r'\{"a":"[^"]*"\}', TOK)
    reference = RegexLogitsProcessor(r'\{"a":"[^"]*"\}', TOK, backend="torch")
    history = [V['{"'], V["a"], V['":'], V['"'], V["x"]]
    gen = torch.Generator().manual_seed(0)
    for length in range(len(history) + 1):
        logits = torch.randn(2, 290, generator=gen)
        ids = [history[:length], history[: max(0, length - 1)]]
        got = fast.process_rows(["p", "q"], ids, logits.clone())
        want = reference.process_rows(["p", "q"], ids, logits.clone())
        assert torch.equal(got, want), length
        bits = fast._bitmask[:2]  # the per-batch bitmask holds each row's words, whichever path applied them
        unpacked = ((bits.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).reshape(2, -1).bool()
        covered = unpacked.shape[1]  # 288 bits for 279 ids; the 2 columns past them are padding
        assert torch.equal(unpacked, got[:, :covered] != float("-inf"))
        assert bool((got[:, covered:] == float("-inf")).all())


def test_assisted_decoding_goes_back_to_the_accepted_candidates():
    """Stock assisted decoding (`prompt_lookup_num_tokens`, `assistant_model`) calls the processor on the ids up to
    each candidate position in turn (one token longer each), then on the accepted ids only, which can be shorter
    than the last call: those rows are replayed, not taken for a new `generate` call (which reset them before)."""
    proc = ChoiceLogitsProcessor(["12", "1x"], TOK)
    prompt = [5, 6]
    proc(torch.tensor([prompt]), torch.zeros(1, 279))
    proc(torch.tensor([prompt + [ONE]]), torch.zeros(1, 279))  # candidate "1"
    proc(torch.tensor([prompt + [ONE, X]]), torch.zeros(1, 279))  # candidate "x" after it (then rejected)
    # the next round starts from the accepted "1": same length as an earlier call, not one token longer
    assert allowed(proc(torch.tensor([prompt + [ONE]]), torch.zeros(1, 279))) == [sorted([TWO, X])]
    # a candidate the constraint refuses is judged without an error (its position's mask is not used)
    proc(torch.tensor([prompt + [ONE, DOT]]), torch.zeros(1, 279))
    assert allowed(proc(torch.tensor([prompt + [ONE, TWO]]), torch.zeros(1, 279)))[0] == [EOS]


def test_stock_prompt_lookup_decoding_keeps_the_regex():
    import re

    from hf_paged import default_model

    model, tok = default_model()
    pattern = r"[a-z]{2,6}@[a-z]{3}\.(com|org)"
    inputs = tok(["Answer: "], return_tensors="pt")
    texts = []
    for lookup in ({}, {"prompt_lookup_num_tokens": 3}):
        proc = RegexLogitsProcessor(pattern, tok)
        out = model.generate(**inputs, max_new_tokens=30, logits_processor=[proc], **lookup)
        texts.append(tok.decode(out[0, inputs.input_ids.shape[1]:], skip_special_tokens=True))
    assert re.fullmatch(pattern, texts[1]) and texts[0] == texts[1]  # assisted greedy is greedy
