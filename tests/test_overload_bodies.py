"""A big completions `prompt` is validated in one pass over the form its first item picks (`serving/protocol.py`).

The plain union `str | list[str] | list[int] | list[list[int]]` tried every form on every item: a 31 MB body of token
ids cost 1.4 GB and 3 s of validation before its 400 (the prompt is longer than the model's context), so a few such
bodies at once took the server's memory. Work is counted here as pydantic's errors (one per item per form tried)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from hf_paged.serving.body import decode_request
from hf_paged.serving.errors import ApiError
from hf_paged.serving.protocol import ChatCompletionRequest, CompletionRequest

NUM_IDS = 100_000


def test_a_long_prompt_of_ids_is_checked_once_per_id():
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": [7] * NUM_IDS + ["x"]})
    assert len(info.value.errors()) == 1  # (the plain union: 100,002, one per id from list[str] and more)


@pytest.mark.parametrize(("model", "body"), [
    (CompletionRequest, {"prompt": "x", "stop": [1] * NUM_IDS}),
    (CompletionRequest, {"prompt": "x", "guided_choice": [1] * NUM_IDS}),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": ["x"] * NUM_IDS}]}),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": 5}] * NUM_IDS}),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "tools": [1] * NUM_IDS}),
])
def test_a_long_bad_list_stops_at_its_first_bad_item(model, body):
    """(Without `fail_fast`: one error per item, 100,000+; a 9 MB chat content of strings took 25 s and 3.8 GB.)"""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    assert len(info.value.errors()) <= 3  # (one per branch of the field's union at most)


@pytest.mark.parametrize("prompt", ["hi", "", ["a", "b"], [1, 2], [[1], [2, 3]], [], [[]]])
def test_every_prompt_form_still_parses(prompt):
    assert CompletionRequest.model_validate({"prompt": prompt}).prompt == prompt


@pytest.mark.parametrize(("prompt", "message"), [
    (5, "a string, a list of strings, a list of token ids"),
    (None, "a string, a list of strings, a list of token ids"),
    ({"a": 1}, "a string, a list of strings, a list of token ids"),
    ([1, "a"], "valid integer"),
    (["a", 1], "valid string"),
    ([[1], 2], "valid list"),
    ([1.5], "valid integer"),
    ([True], "valid integer"),
])
def test_a_wrong_prompt_is_a_400_naming_it(prompt, message):
    with pytest.raises(ApiError) as info:
        decode_request(json.dumps({"prompt": prompt}).encode(), CompletionRequest, "m")
    assert info.value.status == 400 and info.value.param == "prompt" and message in str(info.value)


def test_big_bodies_are_decoded_a_few_at_a_time(monkeypatch):
    """Eight big bodies at once: at most MAX_BIG_BODIES_DECODING decode together (the rest wait, read), and all
    are answered. Without the bound all eight decoded at once on anyio's worker threads."""
    import threading
    import time

    import httpx

    import hf_paged.serving.app as app_module
    from hf_paged import default_model
    from hf_paged.serving.admission import MAX_BIG_BODIES_DECODING
    from hf_paged.serving.body import OFF_LOOP_BYTES
    from tests.serving.conftest import make_server

    lock, live, most = threading.Lock(), [0], [0]
    real = app_module.decode_request

    def counting(raw, model, name):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        try:
            time.sleep(0.3)  # (overlap the decodes; what is asserted is how many ran together)
            return real(raw, model, name)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(app_module, "decode_request", counting)
    body = json.dumps({"prompt": [7] * (OFF_LOOP_BYTES // 2), "max_tokens": 1}).encode()
    assert len(body) > OFF_LOOP_BYTES
    server, _engine = make_server(default_model())
    with server:
        codes = []

        def post():
            codes.append(httpx.post(server.url + "/v1/completions", content=body, timeout=120,
                                    headers={"Content-Type": "application/json"}).status_code)

        threads = [threading.Thread(target=post) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert codes == [400] * 8  # (the prompt is longer than the model's context)
    assert 1 <= most[0] <= MAX_BIG_BODIES_DECODING
