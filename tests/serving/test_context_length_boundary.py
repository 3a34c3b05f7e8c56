"""The context check at its boundary: prompt tokens + max_tokens == the model's positions runs; one more is a 400
naming the model's limit, with `max_tokens` as the parameter to lower (vLLM's wording and semantics). h87's mutation
audit: the server's check moved one past the limit passed every test (none sat on the boundary)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from tests.serving.test_errors import assert_error, post


def test_the_last_position_is_usable_and_one_past_it_is_refused(server, engine):
    max_len = engine.max_model_len
    prompt = [65 + i % 26 for i in range(max_len - 2)]
    body = {"model": "tiny-lm", "prompt": prompt, "temperature": 0, "ignore_eos": True}
    fits = post(server, "/v1/completions", {**body, "max_tokens": 2})
    assert fits.status_code == 200, fits.text
    assert fits.json()["usage"]["total_tokens"] == max_len
    error = assert_error(post(server, "/v1/completions", {**body, "max_tokens": 3}), 400, "max_tokens",
                         [f"maximum context length is {max_len} tokens"])
    assert error["code"] == "context_length_exceeded"
