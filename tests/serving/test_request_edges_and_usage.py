"""Request fields at the edge of their range are honoured (not only refused past it), an empty stop string is a
400 naming `stop`, chat's `max_completion_tokens` wins over `max_tokens`, a failed choice is a 400 only when the
request was at fault, and usage bills a prompt once however many choices (`n`) share it.

These guard promises that a mutation audit (h87) found unguarded: the refusals past each range were tested, the
values at its edge were not, so an off-by-one (`<` for `<=`) at the edge went unnoticed."""

from __future__ import annotations

import pytest

from hf_paged.errors import OutOfBlocksError, SchemaTooComplexError
from hf_paged.serving.generation import ChoiceEvent
from tests.serving.test_errors import assert_error, post

CHAT = [{"role": "user", "content": "hi"}]


def ok(server, path, body) -> dict:
    response = post(server, path, {"model": "tiny-lm", **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_most_logprobs_a_request_may_ask_are_given(server):
    """logprobs: 20 (completions) and top_logprobs: 20 (chat) are the top of the range 0..20: answered, with 20
    alternatives at each position."""
    out = ok(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0, "logprobs": 20})
    tops = out["choices"][0]["logprobs"]["top_logprobs"]
    assert tops and all(len(top) >= 20 for top in tops)  # the top 20, and the chosen token if not among them
    out = ok(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "temperature": 0,
                                              "logprobs": True, "top_logprobs": 20})
    content = out["choices"][0]["logprobs"]["content"]
    assert content and all(len(entry["top_logprobs"]) == 20 for entry in content)


@pytest.mark.parametrize("stop", ["", ["ab", ""]])
def test_an_empty_stop_string_is_refused_naming_stop(server, stop):
    assert_error(post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, "stop": stop}), 400, "stop",
                 ["non-empty"])


def test_a_prompt_shared_by_n_choices_is_billed_once_with_its_cache_hit_once(server):
    """OpenAI bills a prompt once per request whatever `n` is; its cached tokens (the prefix-cache hit) likewise:
    the forks start from their parent's blocks, and counting the hit once per fork reported more cached tokens than
    prompt tokens."""
    prompt = "# billed once per request\n" + "for x in range(10):\n    pass\n" * 6  # many full blocks
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    ok(server, "/v1/completions", body)  # computes the prompt: its full blocks enter the prefix cache
    one = ok(server, "/v1/completions", body)["usage"]
    three = ok(server, "/v1/completions", {**body, "n": 3})["usage"]
    assert one["prompt_tokens_details"]["cached_tokens"] > 0
    assert three["prompt_tokens"] == one["prompt_tokens"]
    assert three["prompt_tokens_details"]["cached_tokens"] == one["prompt_tokens_details"]["cached_tokens"]
    assert three["prompt_tokens_details"]["cached_tokens"] < three["prompt_tokens"]
    assert three["completion_tokens"] == 3 * 2 and three["total_tokens"] == three["prompt_tokens"] + 6


def test_max_completion_tokens_wins_over_max_tokens(server):
    """Chat's `max_completion_tokens` replaced the deprecated `max_tokens` (OpenAI; vLLM reads it first too): given
    both, it is the bound."""
    body = {"messages": CHAT, "temperature": 0, "ignore_eos": True}
    out = ok(server, "/v1/chat/completions", {**body, "max_tokens": 6, "max_completion_tokens": 2})
    assert out["usage"]["completion_tokens"] == 2 and out["choices"][0]["finish_reason"] == "length"
    out = ok(server, "/v1/chat/completions", {**body, "max_tokens": 2, "max_completion_tokens": 6})
    assert out["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize(("error_type", "status"), [
    (SchemaTooComplexError, (400, "invalid_request")),  # the request's own fault, typed by hf_paged: 4xx
    (ValueError, (500, "request_failed")),  # a user processor's bare ValueError: the server's trouble, not a 400
    (OutOfBlocksError, (500, "request_failed")),  # ours but no ValueError/TypeError: not the request's fault
    (RuntimeError, (500, "request_failed")),
    (None, (500, "request_failed")),
])
def test_a_failed_choice_is_a_400_only_for_a_typed_request_error(error_type, status):
    assert ChoiceEvent(0, "", "error", "boom", error_type=error_type).error_status() == status
