"""A text prompt too long for any tokenization to fit is refused from its length, before the tokenizer reads it."""

from __future__ import annotations

import pytest

from hf_paged.serving.prompt_chars import SLACK, max_prompt_chars
from tests.serving.conftest import make_server
from tests.serving.test_errors import assert_error, post


def test_the_bound_is_the_longest_token_string_times_positions(tiny_lm):
    _, tokenizer = tiny_lm
    longest = max(len(t) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    assert max_prompt_chars(tokenizer, 2048) == 2048 * longest * SLACK
    # the bound is sound: the densest text of this vocabulary (its longest token repeated) fits in it
    piece = max(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))), key=len)
    text = piece * 50
    assert len(text) <= max_prompt_chars(tokenizer, len(tokenizer(text)["input_ids"]))


class _Opaque:  # a tokenizer whose vocabulary gives no strings
    def __len__(self):
        return 3

    def convert_ids_to_tokens(self, ids):
        return [b"a", b"b", None]


def test_no_bound_without_string_tokens():
    assert max_prompt_chars(_Opaque(), 2048) is None


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", lambda text: {"prompt": text, "max_tokens": 1}, "prompt"),
    ("/v1/completions", lambda text: {"prompt": ["hi", text], "max_tokens": 1}, "prompt"),
])
def test_a_prompt_past_the_bound_is_refused_without_tokenizing(tiny_lm, path, body, param):
    model, tokenizer = tiny_lm
    server, engine = make_server(tiny_lm)
    bound = max_prompt_chars(tokenizer, engine.max_model_len)
    calls = []
    real = type(tokenizer).__call__

    def counting(self, text, *args, **kwargs):
        calls.append(len(text) if isinstance(text, str) else None)
        return real(self, text, *args, **kwargs)

    with server, pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(tokenizer), "__call__", counting)
        error = assert_error(post(server, path, body("x" * (bound + 1))), 400, param,
                             [f"{bound + 1:,} characters", "shorten the prompt"])
        assert error["code"] == "context_length_exceeded"
        assert bound + 1 not in calls  # refused before the tokenizer read it
        # at the bound the exact check runs (the tokenizer reads it) and says so in tokens
        assert_error(post(server, path, body("x" * bound)), 400, param, ["maximum context length is 2048 tokens"])
        assert bound in calls


def test_a_chat_past_the_bound_is_refused(tiny_lm):
    _, tokenizer = tiny_lm
    server, engine = make_server(tiny_lm)
    bound = max_prompt_chars(tokenizer, engine.max_model_len)
    with server:
        response = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * bound}],
                                                         "max_tokens": 1})
        if response.status_code == 400 and "chat template" in response.text:
            pytest.skip("the embedded tokenizer has no chat template")
        assert_error(response, 400, "messages", ["characters", "shorten the messages"])
