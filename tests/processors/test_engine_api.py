"""Continuous-batching contract: rows keyed by request id, coming and going; forced tokens; release."""

from __future__ import annotations

import torch

from hf_paged.processors import ChoiceLogitsProcessor, RegexLogitsProcessor
from tests.processors.toy_tokenizers import byte_level_tokenizer

TOK = byte_level_tokenizer()
V = TOK.get_vocab()
EOS, ONE, TWO, X, TWELVE = V["<eos>"], V["1"], V["2"], V["x"], V["12"]


def allowed(scores: torch.Tensor) -> list[list[int]]:
    return [(row != float("-inf")).nonzero().flatten().tolist() for row in scores]


def test_rows_come_and_go():
    proc = ChoiceLogitsProcessor(["12", "1x"], TOK)
    proc.prepare()
    proc.prepare()  # idempotent
    out = proc.process_rows(["a", "b"], [[], [ONE]], torch.zeros(2, 279))
    assert allowed(out) == [[ONE, TWELVE], sorted([TWO, X])]
    assert not proc.is_complete("a") and not proc.is_complete("b")
    # "a" left the batch for a step, "c" is new, "b" advanced by one token
    out = proc.process_rows(["b", "c"], [[ONE, X], []], torch.zeros(2, 279))
    assert allowed(out) == [[EOS], [ONE, TWELVE]]
    assert proc.is_complete("b") and not proc.is_complete("c")
    # "a" comes back two tokens later
    out = proc.process_rows(["a"], [[ONE, TWO]], torch.zeros(1, 279))
    assert allowed(out) == [[EOS]] and proc.is_complete("a")
    assert proc.num_active_requests == 3
    proc.release("a")
    proc.release("a")
    proc.release("never-seen")
    assert proc.num_active_requests == 2 and not proc.is_complete("a")
    # a released id used again starts a fresh document
    assert allowed(proc.process_rows(["a"], [[]], torch.zeros(1, 279))) == [[ONE, TWELVE]]


def test_restarted_request_gets_a_fresh_guide():
    proc = ChoiceLogitsProcessor(["12", "1x"], TOK)
    proc.process_rows(["r"], [[ONE, TWO]], torch.zeros(1, 279))
    # recomputed after preemption with a shorter history: state follows the history given
    assert allowed(proc.process_rows(["r"], [[ONE]], torch.zeros(1, 279))) == [sorted([TWO, X])]


def test_forced_tokens_chain_single_continuations():
    proc = RegexLogitsProcessor(r"xyz(1|2)", TOK)
    xs = [V["x"], V["y"], V["z"]]
    assert proc.forced_tokens("q", [], max_tokens=10) == xs
    assert proc.forced_tokens("q", [], max_tokens=2) == xs[:2]
    assert proc.forced_tokens("q", [], max_tokens=0) == []
    # not moved by forced_tokens: the engine feeds the tokens back through `generated`
    assert allowed(proc.process_rows(["q"], [[]], torch.zeros(1, 279))) == [[V["x"]]]
    assert proc.forced_tokens("q", xs, max_tokens=10) == []  # "1" or "2": a real choice
    assert proc.forced_tokens("q", xs + [ONE], max_tokens=10) == []  # complete: EOS is never forced
    assert proc.is_complete("q")


def test_no_forced_tokens_when_several_tokenizations_exist():
    proc = RegexLogitsProcessor(r"name", TOK)  # "n", "na", "name" are all allowed first
    assert proc.forced_tokens("k", [], max_tokens=5) == []
    assert proc.forced_tokens("k", [V["na"]], max_tokens=5) == []  # "m" or "me"
    assert proc.forced_tokens("k", [V["na"], V["me"]], max_tokens=5) == []  # complete


def test_processor_shares_the_compiled_index():
    first = ChoiceLogitsProcessor(["12", "1x"], TOK)
    second = ChoiceLogitsProcessor(["12", "1x"], TOK)
    assert first.compiled is second.compiled


def test_state_masks_are_computed_once_per_index():
    proc = ChoiceLogitsProcessor(["12", "1x", "xx"], TOK, eos_token_id=[EOS, V["<|end|>"]])
    first = allowed(proc.process_rows(["a"], [[ONE, TWO]], torch.zeros(1, 279)))
    compiled = proc.compiled
    state = compiled.index.get_next_state(compiled.index.get_next_state(compiled.index.get_initial_state(), ONE), TWO)
    assert compiled.state_mask(state) is not None  # remembered, EOS mirroring included
    # another request reaching the same state by another path is served from the memo, identically
    again = allowed(proc.process_rows(["b"], [[TWELVE]], torch.zeros(1, 279)))
    assert first == again == [[EOS, V["<|end|>"]]]


def test_a_document_completed_by_the_last_allowed_token_is_complete():
    """`max_new_tokens` exactly the document's length: it ended "length_incomplete" (with a warning that the text
    will not parse, and needless retries) because completeness was read before the last token."""
    import hf_paged
    from hf_paged import SamplingParams

    model, tok = hf_paged.default_model()
    hf_paged.wrap(model)
    try:
        proc = RegexLogitsProcessor("ab", tok)
        (out,) = model.generate_batch([tok("x").input_ids], sampling_params=SamplingParams(
            max_new_tokens=2, logits_processors=[proc])).values()
        assert tok.decode(out.generated_tokens) == "ab" and out.finish_reason == "length"
        cut = RegexLogitsProcessor("abc", tok)
        (out,) = model.generate_batch([tok("x").input_ids], sampling_params=SamplingParams(
            max_new_tokens=2, logits_processors=[cut])).values()
        assert out.finish_reason == "length_incomplete"
    finally:
        hf_paged.unwrap(model)
