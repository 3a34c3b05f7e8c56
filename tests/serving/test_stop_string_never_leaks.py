"""A stop sequence never shows, not even its first characters, when the output reaches it one token at a time:
`TextStream` holds back every tail that may still become a stop sequence (up to its length minus one), and the
chunks it hands out add up to the text before the stop. The expected text is written out here, not derived from
`TextStream` (the other stream tests compare two streams that share the stop logic).

Mutation audit (h87): holding back one character fewer (`max(len(s)) - 2`) in `_held_back`, and cutting at the
last stop found in a push instead of the first (`max(hits)`), survived tests/serving/test_text_stream.py."""

from __future__ import annotations

import pytest

from hf_paged import default_model
from hf_paged.serving.text import TextStream


@pytest.fixture(scope="module")
def tokenizer():
    return default_model()[1]  # byte-level: one token per ASCII character


@pytest.mark.parametrize(("text", "stops", "shown"), [
    ("one two; three", ["; t"], "one two"),  # a 3-character stop: "; " is held back until "t" decides
    ("xxabcd", ["abcd", "zz"], "xx"),  # a 4-character stop reached one character at a time
    ("ab ab abc", ["abc"], "ab ab "),  # held-back tails that turn out not to be the stop are shown later
    ("no stop here", ["stop!"], "no stop here"),  # a tail "stop" held back to the end, then shown
])
def test_a_stop_sequence_reached_token_by_token_never_shows(tokenizer, text, stops, shown):
    stream = TextStream(tokenizer, stops)
    chunks = [stream.push([token]) for token in tokenizer(text, add_special_tokens=False)["input_ids"]]
    chunks.append(stream.finish())
    assert "".join(chunks) == shown
    assert stream.stopped == (shown != text)
    for stop in stops:  # no chunk ever showed the beginning of the stop where the stop then came
        assert stop not in "".join(chunks)


@pytest.mark.parametrize("stops", [[".", ";"], [";", "."], ["b.", ";"]])
def test_the_text_ends_before_the_first_stop_when_one_push_holds_several(tokenizer, stops):
    """OpenAI's text ends at the earliest stop sequence, whichever of them is listed first."""
    stream = TextStream(tokenizer, stops)
    ids = tokenizer("a;b.c;d", add_special_tokens=False)["input_ids"]
    assert stream.push(ids) + stream.finish() == "a" and stream.stopped
