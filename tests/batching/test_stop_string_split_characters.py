"""A stop string's characters may each span several tokens (a byte-level vocabulary spells "é" as two byte tokens,
a CJK character as three): the stop check decodes enough of the output's tail to hold the whole string. h82's
mutation audit (P2: a tail of one token per character) passed every stop-string test, whose stops were ASCII."""

from __future__ import annotations

import pytest

from hf_paged.batching.request import Request
from hf_paged.batching.sampling import SamplingParams
from hf_paged.batching.stopping import check_stop
from tests.tiny_models import byte_tokenizer


@pytest.mark.parametrize("stop", ["é", "日本", "a€b"])
def test_a_stop_of_multibyte_characters_ends_the_request(stop):
    tok = byte_tokenizer()
    request = Request("r", [1, 2], SamplingParams(max_new_tokens=100, stop_strings=[stop], tokenizer=tok))
    text = "xy" + stop
    tokens = tok(text, add_special_tokens=False)["input_ids"]
    for token in tokens[:-1]:  # not before the stop's last byte
        request.output_ids.append(token)
        assert check_stop(request, 10_000) is None
    request.output_ids.append(tokens[-1])
    assert len(request.output_ids) > len(text)  # the premise: more tokens than characters
    assert check_stop(request, 10_000) == "stop"


def _verdicts(stop: str, tokens: list[int]) -> list[str | None]:
    """check_stop after each of `tokens` is appended."""
    request = Request("r", [1, 2], SamplingParams(max_new_tokens=100, stop_strings=[stop], tokenizer=byte_tokenizer()))
    verdicts = []
    for token in tokens:
        request.output_ids.append(token)
        verdicts.append(check_stop(request, 10_000))
    return verdicts


def test_a_stop_of_the_replacement_character_waits_for_the_character_to_complete():
    """A character's first bytes decode to U+FFFD until its last byte comes: not text yet (vLLM holds it back),
    so a stop of U+FFFD (a client stopping on broken bytes) must not fire there, nor on a tail that begins inside
    a character written earlier ("é" then four ASCII bytes: a 5-token tail starts at é's second byte)."""
    tok = byte_tokenizer()
    ids = tok("xé日abcd", add_special_tokens=False)["input_ids"]
    assert len(ids) == 10  # one token a byte: é two, 日 three
    assert _verdicts("\ufffd", ids) == [None] * 10
    # a byte that stays invalid (é's first byte, then "y") is broken text once the next token follows it
    first_byte_of_e = tok("é", add_special_tokens=False)["input_ids"][0]
    x, y = tok("xy", add_special_tokens=False)["input_ids"]
    assert _verdicts("\ufffd", [x, first_byte_of_e, y]) == [None, None, "stop"]
