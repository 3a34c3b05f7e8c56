"""A stop string's characters may each span several tokens (a byte-level vocabulary spells "é" as two byte tokens,
a CJK character as three): the stop check decodes enough of the output's tail to hold the whole string. h82's
mutation audit (P2: a tail of one token per character) passed every stop-string test, whose stops were ASCII."""

from __future__ import annotations

import random

import pytest

from hf_paged.batching.request import Request
from hf_paged.batching.sampling import SamplingParams
from hf_paged.batching.stopping import check_stop, settled
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


def _first_stop_reading_the_whole_output(stops: list[str], tokens: list[int]) -> int | None:
    """The oracle: the first step whose whole output, special tokens spelled out or skipped, holds a stop string
    (the text's trailing U+FFFD held back: `settled`)."""
    tok = byte_tokenizer()
    for step in range(1, len(tokens) + 1):
        for skip in (False, True):
            if any(s in settled(tok.decode(tokens[:step], skip_special_tokens=skip)) for s in stops):
                return step
    return None


@pytest.mark.parametrize("stops", [["\ufffd"], ["a\ufffd"], ["\ufffd\ufffd"], ["\ufffdé"], ["\ufffd", "zz"],
                                   ["é\ufffd日"]])
def test_a_stop_holding_the_replacement_character_fires_where_the_whole_output_first_holds_it(stops):
    """It reads a bounded tail, not the whole output (see the test below), and still stops exactly where the whole
    output's text first holds the stop: random bytes of valid one- to four-byte characters, lone continuation and
    lead bytes, and a special token between them."""
    tok = byte_tokenizer()
    rng = random.Random(repr(stops))  # (a str seed is the same in every process)
    pieces = [tok(c, add_special_tokens=False)["input_ids"] for c in ("a", "z", "é", "日", "😀", " ")]
    c3, a9, e6, x97, _, f0 = tok("é日😀", add_special_tokens=False)["input_ids"][:6]
    pieces += [[a9], [x97], [c3], [e6], [f0], [tok.eos_token_id]]  # lone continuation and lead bytes, a special
    fired = 0
    for _ in range(40):
        tokens = [t for _ in range(100) for t in rng.choice(pieces)]
        expected = _first_stop_reading_the_whole_output(stops, tokens)
        verdicts = _verdicts_of(stops, tokens)
        got = next((i + 1 for i, v in enumerate(verdicts) if v == "stop"), None)
        assert got == expected, (stops, tokens[: (expected or got or 0) + 1])
        fired += expected is not None
    assert fired >= 5  # the premise: the streams do reach the stops


def _verdicts_of(stops: list[str], tokens: list[int]) -> list[str | None]:
    request = Request("r", [1, 2], SamplingParams(max_new_tokens=10_000, stop_strings=stops,
                                                  tokenizer=byte_tokenizer()))
    verdicts = []
    for token in tokens:
        request.output_ids.append(token)
        verdicts.append(check_stop(request, 100_000))
        if verdicts[-1] is not None:
            break
    return verdicts


def test_a_stop_holding_the_replacement_character_decodes_a_bounded_tail_each_step():
    """A client's stop of U+FFFD read the whole output at every step: a decode of n tokens at step n, quadratic
    over a long generation, on the engine's thread (every request in the batch waits for it)."""
    tok = byte_tokenizer()
    decoded: list[int] = []
    decode = tok.decode

    def counting(ids, **kwargs):
        decoded.append(len(ids))
        return decode(ids, **kwargs)

    tok.decode = counting
    request = Request("r", [1, 2], SamplingParams(max_new_tokens=10_000, stop_strings=["\ufffd"], tokenizer=tok))
    for token in tok("abcdefgh" * 250, add_special_tokens=False)["input_ids"]:
        request.output_ids.append(token)
        assert check_stop(request, 100_000) is None
    assert len(request.output_ids) == 2000
    assert max(decoded) <= 4 * 1 + 8  # the tail of a one-character stop, whatever the output's length


def test_a_run_of_invalid_bytes_ends_a_stop_of_the_replacement_character():
    """Only the last 3 U+FFFD of a text can still be a character's first bytes (`settled`): the ones before are
    broken text. A model biased to an invalid byte (the server's `logit_bias`) wrote U+FFFD until max_tokens while
    the client's text was cut at the first one, and the tokens were computed and billed."""
    tok = byte_tokenizer()
    ff = tok.convert_tokens_to_ids("Ń")  # byte 0xFF: never part of a character
    assert tok.decode([ff, ff]) == "\ufffd\ufffd"
    assert _verdicts("\ufffd", [ff] * 5) == [None, None, None, "stop", "stop"]
    assert settled("ab\ufffd\ufffd\ufffd\ufffd\ufffd") == "ab\ufffd\ufffd"
    assert settled("ab\ufffd") == settled("ab") == "ab"
