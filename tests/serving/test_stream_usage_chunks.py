"""With `stream_options: {"include_usage": true}` every chunk but the last carries `"usage": null`, and the last has
empty `choices` and the request's usage (OpenAI's streaming format, which clients such as the openai SDK read);
without it no chunk has a `usage` key. h87's mutation audit: dropping the per-chunk null passed every test."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from tests.serving.test_logprobs import streamed


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6, "temperature": 0}),
], ids=["completions", "chat"])
def test_usage_is_null_on_every_chunk_but_the_last(server, path, body):
    chunks = streamed(server, path, {**body, "stream_options": {"include_usage": True}})
    *content, last = chunks
    assert len(content) > 1 and all("usage" in c and c["usage"] is None for c in content)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6 * body.get("n", 1)
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    plain = streamed(server, path, body)
    assert plain and not any("usage" in c for c in plain)
