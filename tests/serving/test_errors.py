"""Bad input and trouble: OpenAI error bodies with a 4xx (never a 500 or a traceback for the client's mistakes),
aborted disconnects, 429 under a bounded queue, a failing processor that fails alone."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest
from transformers import LogitsProcessor

from hf_paged.errors import SchemaTooComplexError
from hf_paged.serving import ServerSettings
from tests.serving.conftest import make_server, wait_idle


def post(server, path, body, timeout=60):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json"},
                      timeout=timeout)


def _wait_until(condition, timeout=120.0):  # generous: a loaded machine (CI shares its cores)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.005)


def assert_error(response, status, param=None, words=()):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in response.text
    if param is not None:
        assert body["error"]["param"] == param
    for word in words:
        assert word in body["error"]["message"], body["error"]["message"]
    return body["error"]


DEEP = {"type": "object", "properties": {"xs": {"type": "array", "contains": {"type": "integer"}, "maxContains": 2}}}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ('{"prompt": "x", "max_tokens": ', None, ["not valid JSON"]),
        ("[1, 2]", None, ["JSON object"]),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", ["at least 1"]),
        ({"prompt": "x", "max_tokens": -5}, "max_tokens", ["at least 1"]),
        ({"prompt": "x", "max_tokens": "ten"}, "max_tokens", ["integer"]),
        ({"prompt": "x", "temperature": -1}, "temperature", ["greater than or equal to 0"]),
        ({"prompt": "x", "temperature": "hot"}, "temperature", ["should be a number", "'hot'"]),
        ({"prompt": 5}, "prompt", []),
        ({"prompt": "x", "stop": 5}, "stop", ["a string or a list"]),
        ({"prompt": "x", "n": 0}, "n", []),
        ({"prompt": "x", "top_p": 0}, "top_p", []),
        ({"prompt": "x", "max_token": 5}, "max_token", ["Extra inputs"]),
        ({"prompt": "x", "seed": 2**64}, "seed", []),
        ({"prompt": "x", "logprobs": 21}, "logprobs", ["from 0 to 20"]),
        ({"prompt": "x", "echo": True, "max_tokens": 0}, "logprobs", ["logprobs: 0"]),
        ({"prompt": "x" * 3000, "max_tokens": 4}, "prompt", ["maximum context length is 2048"]),
        ({"prompt": "x" * 2000, "max_tokens": 100}, "max_tokens", ["maximum context length is 2048"]),
        ({"prompt": [1, 2, 999]}, "prompt", ["outside the vocabulary"]),
        ({"prompt": []}, "prompt", ["empty"]),
        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}},
         "response_format", ["#/type"]),
        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": DEEP}}},
         "response_format", ["maxContains", "/properties/xs"]),
        ({"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format", ["json_schema"]),
        ({"prompt": "x", "guided_regex": "(unclosed"}, "guided_regex", []),
        ({"prompt": "x", "guided_choice": []}, "guided_choice", []),
        ({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", ["one output constraint"]),
        ({"prompt": "x", "guided_grammar": "start: foo"}, "guided_grammar", ["'foo'", "not defined"]),
        ({"prompt": "x", "guided_grammar": 'start: ("a"'}, "guided_grammar", ["line 1"]),
        ({"prompt": "x", "guided_grammar": "start: a", "guided_regex": "a"}, "guided_grammar",
         ["one output constraint"]),
        ({"prompt": "x", "guided_regex": "a", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern",
         ["JSON constraints"]),
        ({"prompt": "x", "guided_json": {"type": "object"}, "guided_whitespace_pattern": "(x"}, "guided_json",
         ["whitespace='(x'"]),
        ({"prompt": "x", "guided_json": {"type": "object"}, "guided_whitespace_pattern": ",?"}, "guided_json",
         ["no JSON whitespace"]),  # documents that did not parse, ending "stop"
        ({"prompt": "x", "guided_regex": "ab", "min_tokens": 3}, "min_tokens", ["min_tokens", "guided_regex"]),
        # found by a hostile pass (session 30): a 400 naming no field, or a schema silently ignored
        pytest.param({"prompt": "x", "logit_bias": {"9" * 5000: 1}}, "logit_bias", ["token ids"], id="bias-digits"),
        pytest.param({"prompt": "xy", "echo": True, "max_tokens": 0, "logprobs": 0, "logit_bias": {"99999": 1}},
                     "logit_bias", ["outside this model's vocabulary"], id="bias-outside-vocab-scoring"),
        pytest.param({"prompt": "x", "response_format": {"type": "json_object", "json_schema": {"schema": {}}}},
                     "response_format", ['type "json_schema"'], id="schema-beside-json-object"),
        # found by a hostile pass (issue 36): each was a 500 or silently accepted before
        pytest.param('{"prompt": ' + "[" * 5000 + "]" * 5000 + "}", None, ["nests too deeply"], id="deep-array"),
        pytest.param('{"prompt": "x", "metadata": ' + '{"a": ' * 5000 + "1" + "}" * 5001, None,
                     ["nests too deeply"], id="deep-object"),
        ({"prompt": "x", "guided_whitespace_pattern": ""}, "guided_whitespace_pattern", ["JSON constraints"]),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", ["stream: true"]),
        ({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens", ["max_tokens=4"]),
        # found by a new-user pass (session 12): an infinite temperature or penalty reached the sampler
        pytest.param('{"prompt": "x", "temperature": 1e309}', "temperature", ["finite"], id="inf-temperature"),
        pytest.param('{"prompt": "x", "repetition_penalty": 1e309}', "repetition_penalty", ["finite"],
                     id="inf-penalty"),
        # found by a hostile pass (session 30): NaN read "should be greater than or equal to 0"; an item of a list
        # read as the other union branch's "should be a string"
        pytest.param('{"prompt": "x", "temperature": NaN}', "temperature", ["finite number"], id="nan-temperature"),
        pytest.param('{"prompt": "x", "top_p": NaN}', "top_p", ["finite number"], id="nan-top-p"),
        pytest.param('{"prompt": "x", "logit_bias": {"3": NaN}}', "logit_bias", ["finite number"], id="nan-bias"),
        ({"prompt": "x", "stop": ["a", 3]}, "stop", ["stop[1]", "a valid string"]),
    ],
)
def test_bad_completion_requests_get_400(server, body, param, words):
    assert_error(post(server, "/v1/completions", body), 400, param, words)


def test_bad_chat_requests_get_400(server, tiny_lm):
    assert_error(post(server, "/v1/chat/completions", {"messages": []}), 400, "messages")
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}), 400)
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                        "max_completion_tokens": 0}), 400, "max_completion_tokens")
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                        "tools": [{"type": "function"}]}), 400, "tools")
    long = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5000}  # (never said max_tokens)
    assert_error(post(server, "/v1/chat/completions", long), 400, "max_completion_tokens", ["max_completion_tokens="])
    image = [{"type": "image_url", "image_url": {"url": "https://x"}}]  # (read "should be a valid string" before)
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": image}]}), 400,
                 "messages", ["messages[0].content[0].type", "'text'"])
    # only an assistant turn may have no content (OpenAI's rule); a null question was answered as "" before
    for messages, where in (([{"role": "user", "content": None}], "messages[0].content"),
                            ([{"role": "user"}], "messages[0].content"),
                            ([{"role": "user", "content": "x"}, {"role": "system", "content": None}],
                             "messages[1].content")):
        assert_error(post(server, "/v1/chat/completions", {"messages": messages}), 400, "messages",
                     [where, "needs content"])
    assert post(server, "/v1/chat/completions", {"messages": [{"role": "assistant", "content": None},
                                                              {"role": "user", "content": "x"}],
                                                 "max_tokens": 2}).status_code == 200
    tokenizer = tiny_lm.tokenizer
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}), 400,
                     "messages", ["no chat template", "/v1/completions"])
    finally:
        tokenizer.chat_template = template


def test_wrong_model_and_unknown_route(server):
    assert_error(post(server, "/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404, "model", ["tiny-lm"])
    assert_error(httpx.get(server.url + "/v1/nothing"), 404)
    assert_error(httpx.get(server.url + "/v1/completions"), 405)


def test_client_disconnect_mid_stream_aborts_and_frees_blocks(server, engine):
    body = {"prompt": "def main():", "max_tokens": 1500, "stream": True, "temperature": 0}
    aborted = engine.metrics.num_requests_aborted
    with httpx.Client(timeout=60) as client, client.stream("POST", server.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in got)
        assert engine.cache.pool.num_used_blocks > 0
    wait_idle(engine)  # the request is gone and its blocks are back
    assert engine.metrics.num_requests_aborted == aborted + 1
    assert server.app.state.server.num_admitted == 0  # nothing left counted as waiting
    scraped = httpx.get(server.url + "/metrics", timeout=30).text
    assert f'hf_paged:request_aborted_total{{model_name="tiny-lm"}} {aborted + 1}.0' in scraped


def test_client_disconnect_without_streaming_aborts(server, engine):
    aborted = engine.metrics.num_requests_aborted
    with pytest.raises(httpx.ReadTimeout):
        post(server, "/v1/completions", {"prompt": "def main():", "max_tokens": 1900, "ignore_eos": True},
             timeout=0.5)  # sampled: no EOS, so it cannot end before the 0.5 s the client waits
    wait_idle(engine)
    assert engine.metrics.num_requests_aborted == aborted + 1
    assert server.app.state.server.num_admitted == 0


class Exploding(LogitsProcessor):
    def __call__(self, input_ids, scores):
        raise RuntimeError("boom")


def test_a_failing_processor_fails_only_its_request(server, engine):
    constraints = server.app.state.server.preparer.constraints
    constraints._items[("regex", json.dumps("explode"), None, False, None)] = Exploding()  # what the cache returns
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            good = [pool.submit(post, server, "/v1/completions", {"prompt": f"def f{i}():", "max_tokens": 20,
                                                                 "ignore_eos": True})  # sampled: 20 tokens, no EOS
                    for i in range(3)]
            bad = pool.submit(post, server, "/v1/completions", {"prompt": "x", "max_tokens": 20,
                                                                "guided_regex": "explode"})
            streamed = pool.submit(post, server, "/v1/completions", {"prompt": "x", "max_tokens": 20, "stream": True,
                                                                     "guided_regex": "explode"})
        for future in good:
            assert future.result().status_code == 200
            assert future.result().json()["usage"]["completion_tokens"] == 20
        error = assert_error(bad.result(), 500, words=["boom"])
        assert error["type"] == "server_error"
        events = [line for line in streamed.result().text.splitlines() if line.startswith("data: ")]
        assert "boom" in json.loads(events[0][6:])["error"]["message"] and events[-1] == "data: [DONE]"
    finally:
        constraints._items.pop(("regex", json.dumps("explode"), None, False, None), None)


def test_a_distribution_that_overflows_fails_only_its_request(server, engine):
    """A distribution that overflows (a temperature of 1e-40 once, now greedy below 1e-5; a repetition penalty of
    1e-300 divides the prompt's tokens' logits to inf: NaN after the softmax) failed every request in flight with a
    500 (the draw ran outside the per-request guard); now that request alone gets a 400 naming it."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        good = [pool.submit(post, server, "/v1/completions", {"prompt": f"def f{i}():", "max_tokens": 20,
                                                             "ignore_eos": True}) for i in range(2)]
        bad = pool.submit(post, server, "/v1/completions", {"prompt": "hi hi hi", "max_tokens": 4, "temperature": 1,
                                                            "repetition_penalty": 1e-300, "seed": 0})
    for future in good:
        assert future.result().status_code == 200
        assert future.result().json()["usage"]["completion_tokens"] == 20
    assert_error(bad.result(), 400, words=["not finite"])
    wait_idle(engine)
    metrics = httpx.get(server.url + "/metrics", timeout=30).text  # a failure is no success (it counted as one)
    assert 'finished_reason="error"' not in metrics and "hf_paged:request_failed_total" in metrics


class OverBudget(LogitsProcessor):
    def __call__(self, input_ids, scores):
        raise SchemaTooComplexError("the constraint needs more than 50,000 states")


def test_a_request_failing_on_its_own_input_answers_400(server, engine):
    """A typed error of the request's own making raised inside the engine (a constraint over its budget) is the
    client's 400, streamed or not; a processor's plain exception stays a 500 (above)."""
    constraints = server.app.state.server.preparer.constraints
    constraints._items[("regex", json.dumps("too big"), None, False, None)] = OverBudget()
    try:
        body = {"prompt": "x", "max_tokens": 20, "guided_regex": "too big"}
        error = assert_error(post(server, "/v1/completions", body), 400, words=["50,000 states"])
        assert error["type"] == "invalid_request_error"
        streamed = post(server, "/v1/completions", {**body, "stream": True})
        events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert json.loads(events[0][6:])["error"]["code"] == "invalid_request" and events[-1] == "data: [DONE]"
    finally:
        constraints._items.pop(("regex", json.dumps("too big"), None, False, None), None)


def test_a_request_larger_than_the_queue_bound_is_a_400_not_a_flood(tiny_lm):
    """--max-waiting bounded only what was queued before a request: one request of prompts x n sequences past the
    bound was admitted whole (100 prompts x n=128 queued 12,800 sequences)."""
    server, engine = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", max_waiting=8))
    with server:
        r = post(server, "/v1/completions", {"prompt": ["a", "b", "c"], "n": 3, "max_tokens": 2,
                                             "temperature": 1.0})
        assert_error(r, 400, param="n", words=("9 sequences (3 prompts x n=3)", "--max-waiting"))
        assert post(server, "/v1/completions", {"prompt": ["a", "b"], "n": 4, "max_tokens": 2,
                                                "temperature": 1.0}).status_code == 200  # 8: at the bound
        wait_idle(engine)
        assert server.app.state.server.num_admitted == 0


def test_a_full_queue_answers_429_with_retry_after(tiny_lm):
    server, engine = make_server(tiny_lm, max_num_seqs=1,
                                 settings=ServerSettings(model_name="tiny-lm", max_waiting=1))
    with server:
        body = {"prompt": "def main():", "max_tokens": 200, "ignore_eos": True}  # the first runs all along: no EOS
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            first = pool.submit(post, server, "/v1/completions", body)
            _wait_until(lambda: engine.loop.num_in_flight == 1 and engine.loop.num_waiting == 0)
            with engine.lock:  # no step runs: the next request to be admitted stays queued
                burst = [pool.submit(post, server, "/v1/completions", body) for _ in range(5)]
                _wait_until(lambda: sum(f.done() for f in burst) == 4)
            responses = [first.result()] + [f.result() for f in burst]
        codes = sorted(r.status_code for r in responses)
        assert codes == [200, 200, 429, 429, 429, 429], codes  # one ran, one waited, the queue was full for 4
        for r in responses:
            if r.status_code == 429:
                assert_error(r, 429)
                assert r.headers["retry-after"] == "1"
        wait_idle(engine)
        assert server.app.state.server.num_admitted == 0
        metrics = httpx.get(server.url + "/metrics").text
        assert 'hf_paged:request_rejected_total{model_name="tiny-lm",status="429"}' in metrics


def test_the_queue_bound_counts_the_forks_of_n_as_sequences(tiny_lm):
    """--max-waiting counted a waiting request of n=3 as one: its forks (waiting for the parent's first token) were
    not seen, so requests of many sequences each filled the queue far past the bound."""
    server, engine = make_server(tiny_lm, max_num_seqs=1,
                                 settings=ServerSettings(model_name="tiny-lm", max_waiting=4))
    with server:
        body = {"prompt": "def main():", "max_tokens": 40, "temperature": 1.0, "ignore_eos": True}  # no early EOS
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = pool.submit(post, server, "/v1/completions", body)
            _wait_until(lambda: engine.loop.num_in_flight == 1 and engine.loop.num_waiting == 0)
            with engine.lock:  # no step runs: what is admitted stays queued
                three = pool.submit(post, server, "/v1/completions", {**body, "n": 3})
                _wait_until(lambda: engine.loop.num_waiting == 3)
                two = pool.submit(post, server, "/v1/completions", {**body, "n": 2})
                _wait_until(two.done)
                assert_error(two.result(), 429)  # 3 waiting + 2 > 4
                one = pool.submit(post, server, "/v1/completions", body)
                _wait_until(lambda: engine.loop.num_waiting == 4)  # 3 + 1 fits
            responses = [first.result(), three.result(), one.result()]
        assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
        assert len(responses[1].json()["choices"]) == 3
        wait_idle(engine)
        assert server.app.state.server.num_admitted == 0 and engine.loop.num_waiting == 0


def test_an_answer_the_pool_cannot_hold_is_refused_up_front_in_api_terms(tiny_lm):
    """The engine's one prompt check (`prompt_check.py`, whole sequence), worded for the server: 400, the
    `max_tokens` parameter, the `--num-blocks` flag; a request that fits runs."""
    server, _ = make_server(tiny_lm, num_blocks=8)  # 8 blocks of 16: 128 tokens in all
    with server:
        error = assert_error(post(server, "/v1/completions", {"prompt": "x" * 100, "max_tokens": 100}), 400,
                             "max_tokens", ["needs 13 blocks but the pool has 8", "lower max_tokens", "--num-blocks"])
        assert error["code"] == "context_length_exceeded"
        assert post(server, "/v1/completions", {"prompt": "x" * 100, "max_tokens": 20}).status_code == 200
        # a prompt the pool cannot hold at all: the prompt is at fault, lowering max_tokens would not help
        error = assert_error(post(server, "/v1/completions", {"prompt": "x" * 200, "max_tokens": 1}), 400, "prompt",
                             ["holds 128", "shorten the prompt", "--num-blocks"])
        assert "lower max_tokens" not in error["message"]
        # chat without max_tokens: the default is the room the pool leaves, not the model's 2048 positions
        response = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "temperature": 0, "ignore_eos": True})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 128


def test_a_temperature_below_1e_5_samples_greedily_and_health_reads_detail_words(server):
    """Found by a hostile pass (session 30): `temperature: 1e-300` passed the checks, then its logits overflowed in
    the engine (a 400 naming no field, an error event when streamed); `/health?detail=true` answered FastAPI's 422
    body, not OpenAI's."""
    body = {"prompt": "def main():", "max_tokens": 8}
    greedy = post(server, "/v1/completions", {**body, "temperature": 0})
    for tiny in (1e-300, 5e-324, 9e-6):
        tiny_answer = post(server, "/v1/completions", {**body, "temperature": tiny, "seed": 1})
        assert tiny_answer.status_code == 200, tiny_answer.text
        assert tiny_answer.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    for word in ("true", "yes", "1"):
        health = httpx.get(server.url + "/health", params={"detail": word}, timeout=60)
        assert health.status_code == 200 and "checks" in health.json(), health.text
    assert httpx.get(server.url + "/health", params={"detail": "false"}, timeout=60).content == b""
