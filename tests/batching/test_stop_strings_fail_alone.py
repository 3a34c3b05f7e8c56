"""A request's stop strings and their tokenizer are checked when its `SamplingParams` is built, and a stop check that
raises anyway fails that request alone. h8 (F1): `stop_strings=[None]` (or [5], [b"x"], [["a"]], a tokenizer "abc")
was accepted; the step's stop check then raised TypeError and every request of the step ended FAILED, and
`engine.step()` raised on every step until the bad request was aborted."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.errors import InvalidConfigError
from tests.tiny_models import ragged_prompts, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


class _Tokenizer:
    """A tokenizer whose decode gives `text` (or raises it)."""

    def __init__(self, text):
        self.text = text

    def decode(self, ids, **kwargs):
        if isinstance(self.text, Exception):
            raise self.text
        return self.text


@pytest.mark.parametrize("stops", [[None], [5], [b"x"], [["a"]], 5, b"x", {"a": 1}])
def test_stop_strings_that_are_not_strings_are_refused(stops):
    with pytest.raises(InvalidConfigError, match=r"SamplingParams.stop_strings must be None, a string or a list"):
        SamplingParams(stop_strings=stops, tokenizer=_Tokenizer("x"))


@pytest.mark.parametrize("tokenizer", ["abc", None, 5])
def test_a_tokenizer_without_decode_is_refused(tokenizer):
    with pytest.raises(InvalidConfigError, match=r"SamplingParams.stop_strings needs `tokenizer=`"):
        SamplingParams(stop_strings=["x"], tokenizer=tokenizer)


def test_a_string_or_a_tuple_becomes_a_list():
    tok = _Tokenizer("x")
    assert SamplingParams(stop_strings="ab", tokenizer=tok).stop_strings == ["ab"]
    assert SamplingParams(stop_strings=("a", ""), tokenizer=tok).stop_strings == ["a", ""]
    assert SamplingParams(stop_strings=[]).stop_strings == []


def _run_beside(model, bad: SamplingParams) -> tuple[dict, list[int]]:
    """`bad` beside a plain request, stepped by hand (no step may raise); the plain one's tokens alone."""
    prompts = ragged_prompts([9, 11], seed=3)
    good = SamplingParams(max_new_tokens=6)
    alone = Engine(model, PagedConfig(block_size=4))
    rid = alone.add_request(prompts[1], good)
    expected = alone.run()[rid].generated_tokens
    engine = Engine(model, PagedConfig(block_size=4))
    ids = [engine.add_request(prompts[0], bad), engine.add_request(prompts[1], good)]
    outputs = {}
    while engine.has_unfinished:
        for output in engine.step().finished:
            outputs[output.request_id] = output
        engine.check_integrity()
    return {"bad": outputs[ids[0]], "good": outputs[ids[1]]}, expected


@pytest.mark.parametrize(("text", "words"), [(RuntimeError("decode exploded"), "RuntimeError: decode exploded"),
                                             (None, "TypeError: tokenizer.decode returned NoneType, not str")])
def test_a_tokenizer_whose_decode_fails_fails_its_request_alone(model, text, words):
    outputs, expected = _run_beside(model, SamplingParams(max_new_tokens=6, stop_strings=["x"],
                                                          tokenizer=_Tokenizer(text)))
    assert outputs["bad"].status is RequestStatus.FAILED
    assert outputs["bad"].error == f"stop-string check failed: {words}"
    assert outputs["good"].status is RequestStatus.FINISHED and outputs["good"].generated_tokens == expected


def test_stop_strings_broken_after_the_check_fail_their_request_alone(model):
    """Defence in depth: a field changed after construction raises in the stop check; only its request fails."""
    bad = SamplingParams(max_new_tokens=6, stop_strings=["x"], tokenizer=_Tokenizer("abc"))
    bad.stop_strings = [None]
    outputs, expected = _run_beside(model, bad)
    assert outputs["bad"].status is RequestStatus.FAILED and "TypeError" in outputs["bad"].error
    assert outputs["good"].status is RequestStatus.FINISHED and outputs["good"].generated_tokens == expected
