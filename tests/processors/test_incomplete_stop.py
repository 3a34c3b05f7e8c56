"""A constrained document ended by EOS after its constraint gave up on it: another processor (here `bad_words_ids`
banning every token that starts the JSON object) left only tokens the constraint refuses, so the constraint allowed
EOS alone from then on. Stock `generate` gives the same tokens; the engine reported `finish_reason="stop"`, and
`generate` said nothing, for text that will not parse. Now `"stop_incomplete"` (retried under `max_retries`, as
`"length_incomplete"`) and an `IncompleteDocumentWarning` naming the rows."""

from __future__ import annotations

import warnings

import pytest
import torch

import hf_paged
from hf_paged import RequestStatus, SamplingParams
from hf_paged.api.generate import IncompleteDocumentWarning
from hf_paged.batching.request import Request
from hf_paged.batching.retry import Retrier
from hf_paged.processors import JSONSchemaLogitsProcessor
from tests.processors.test_generate import SCHEMA, tiny_model
from tests.processors.toy_tokenizers import byte_level_tokenizer


@pytest.fixture(scope="module")
def setup():
    tok = byte_level_tokenizer()
    model = tiny_model(tok, len(tok))
    braces = [[i] for t, i in tok.get_vocab().items() if tok.convert_tokens_to_string([t]).lstrip().startswith("{")]
    assert braces
    return tok, model, braces


def test_generate_warns_of_a_document_its_constraint_gave_up_on(setup):
    tok, model, braces = setup
    ids = torch.tensor([tok.encode("A:"), tok.encode("B:")])
    kwargs = {"max_new_tokens": 12, "do_sample": False, "bad_words_ids": braces, "pad_token_id": tok.eos_token_id}
    stock = model.generate(ids, logits_processor=[JSONSchemaLogitsProcessor(SCHEMA, tok)], **kwargs)
    hf_paged.wrap(model)
    try:
        with pytest.warns(IncompleteDocumentWarning, match=r"row\(s\) \[0, 1\] .*ended \(EOS\) before"):
            ours = model.generate(ids, logits_processor=[JSONSchemaLogitsProcessor(SCHEMA, tok)], **kwargs)
        assert torch.equal(ours, stock)
        with warnings.catch_warnings():
            warnings.simplefilter("error", IncompleteDocumentWarning)  # nothing in the way: no warning
            model.generate(ids, logits_processor=[JSONSchemaLogitsProcessor(SCHEMA, tok)], max_new_tokens=40,
                           do_sample=False, pad_token_id=tok.eos_token_id)
    finally:
        hf_paged.unwrap(model)


def test_generate_batch_ends_it_stop_incomplete(setup):
    tok, model, braces = setup
    hf_paged.wrap(model)
    try:
        prompt = tok.encode("A:")
        out = next(iter(model.generate_batch([prompt], max_new_tokens=12, bad_words_ids=braces,
                                             logits_processor=[JSONSchemaLogitsProcessor(SCHEMA, tok)]).values()))
        assert out.finish_reason == "stop_incomplete" and out.generated_tokens[-1] == tok.eos_token_id
    finally:
        hf_paged.unwrap(model)


@pytest.mark.parametrize("reason", ["length_incomplete", "stop_incomplete"])
def test_an_incomplete_document_is_retried_without_validating_it(reason):
    request = Request("r", [1, 2], SamplingParams(do_sample=True, seed=5, max_retries=1, validator=lambda t: 1 / 0))
    request.output_ids = [3, 4]
    decision = Retrier().end_attempt(request, RequestStatus.FINISHED, reason)
    assert decision.retry is not None and decision.error is None  # (the validator that would raise was not called)
    assert [a.finish_reason for a in request.attempts] == [reason]


@pytest.mark.parametrize("choices, stop, reason", [
    (["abc", "abd"], "b", "stop_incomplete"),  # cut to "a": no choice
    (["xy", "xyz"], "z", "stop"),  # "xyz" cut to "xy", a choice (or "xy" then EOS)
    (["xy", "xyz"], "y", "stop_incomplete"),  # cut to "x"
])
def test_a_stop_string_that_cuts_the_document_ends_it_stop_incomplete(setup, choices, stop, reason):
    """Found by a hostile pass (session 31): a stop string inside a constrained document ended it "stop", so a
    program called the value valid (and `max_retries` did not retry it); the text before the stop string decides."""
    from hf_paged.processors import ChoiceLogitsProcessor

    tok, model, _ = setup
    hf_paged.wrap(model)
    try:
        params = SamplingParams(max_new_tokens=12, stop_strings=[stop], tokenizer=tok, eos_token_id=tok.eos_token_id,
                                logits_processors=[ChoiceLogitsProcessor(choices, tok)])
        out = next(iter(model.generate_batch([tok.encode("A:")], sampling_params=params).values()))
        assert out.finish_reason == reason, (out.finish_reason, tok.decode(out.generated_tokens))
        schema = SamplingParams(max_new_tokens=40, stop_strings=[":"], tokenizer=tok, eos_token_id=tok.eos_token_id,
                                logits_processors=[JSONSchemaLogitsProcessor(SCHEMA, tok)])
        out = next(iter(model.generate_batch([tok.encode("A:")], sampling_params=schema).values()))
        assert out.finish_reason == "stop_incomplete" and ":" in tok.decode(out.generated_tokens)
    finally:
        hf_paged.unwrap(model)
