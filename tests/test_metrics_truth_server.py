"""/metrics checked against what the test made happen (h75's hostile pass): an aborted choice, the label sets a
scrape shows before any request, the swapped-requests gauge. A real server on 127.0.0.1 (an ephemeral port)."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from hf_paged import default_model  # noqa: E402
from hf_paged.serving.metrics import ServerMetrics  # noqa: E402
from tests.serving.conftest import make_server, wait_idle  # noqa: E402


def samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_request_success_reasons_are_exposed_at_zero_before_any_request():
    """As vLLM: `rate(request_success_total{finished_reason="length"}[5m])` sees the first request end (a series
    born at 1 hides it) and an alert on it has a series to read before any request."""
    metrics = ServerMetrics(loop=None, model_name="m")
    got = samples(generate_latest(metrics.registry).decode())
    for reason in ("stop", "length"):
        key = ("hf_paged:request_success_total", (("finished_reason", reason), ("model_name", "m")))
        assert got[key] == 0.0
    assert ("hf_paged:num_requests_swapped", (("model_name", "m"),)) in got


def test_a_choice_the_server_aborts_is_counted_aborted_not_successful():
    """A stream the engine aborts under the client (what a shutdown does): one request_aborted, no
    request_success{finished_reason="abort"} and no e2e sample (README: request_success counts stop and length)."""
    server, engine = make_server(default_model())
    with server:
        before = samples(httpx.get(server.url + "/metrics").text)
        lines: list[str] = []

        def stream() -> None:
            body = {"prompt": "abort me", "max_tokens": 1000, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
                lines.extend(response.iter_lines())

        client = threading.Thread(target=stream)
        client.start()
        deadline = time.monotonic() + 60
        while not engine.stats()["generated_tokens"] and time.monotonic() < deadline:
            time.sleep(0.01)
        for rid in [rid for rid, r in engine.requests.items() if not r.ended]:
            engine.abort(rid)
        client.join(timeout=60)
        wait_idle(engine)
        after = samples(httpx.get(server.url + "/metrics").text)
    assert any("shutting_down" in line for line in lines)

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted({"model_name": "tiny-lm", **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("hf_paged:request_aborted_total") == 1
    assert delta("hf_paged:request_success_total", finished_reason="abort") == 0
    assert delta("hf_paged:e2e_request_latency_seconds_count") == 0
    assert delta("hf_paged:time_to_first_token_seconds_count") == 1


def test_long_latencies_land_in_finite_buckets():
    """A 100 s generation and a first token after 5 minutes in the queue: histogram_quantile() reads a bucket
    bound near the truth, not the last finite bound (80 s, when every histogram stopped there: both were +Inf)."""
    metrics = ServerMetrics(loop=None, model_name="m")
    metrics.observe_finished("length", 100.0)
    metrics.observe_tokens(None, 300.0)
    got = samples(generate_latest(metrics.registry).decode())

    def bucket(name: str, le: str) -> float:
        return got[(f"hf_paged:{name}_bucket", (("le", le), ("model_name", "m")))]

    assert bucket("e2e_request_latency_seconds", "60.0") == 0 and bucket("e2e_request_latency_seconds", "120.0") == 1
    assert bucket("time_to_first_token_seconds", "160.0") == 0 and bucket("time_to_first_token_seconds", "640.0") == 1


def test_queue_time_per_request_and_time_per_output_token_per_choice():
    """vLLM's request_queue_time_seconds (one sample per request: forks start on their parent's blocks) and
    request_time_per_output_token_seconds (one per choice of two or more tokens)."""
    server, engine = make_server(default_model(), max_num_seqs=2)
    with server:
        before = samples(httpx.get(server.url + "/metrics").text)
        bodies = [{"prompt": "one", "max_tokens": 4, "ignore_eos": True, "n": 3, "temperature": 1.0, "seed": 3},
                  {"prompt": "two", "max_tokens": 1, "ignore_eos": True},
                  {"prompt": "three", "max_tokens": 6, "ignore_eos": True}]
        answers: list[int] = []
        clients = [threading.Thread(target=lambda b=b: answers.append(
            httpx.post(server.url + "/v1/completions", json=b, timeout=120).status_code)) for b in bodies]
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=120)
        wait_idle(engine)
        after = samples(httpx.get(server.url + "/metrics").text)
    assert answers == [200, 200, 200]

    def delta(name: str) -> float:
        key = (name, (("model_name", "tiny-lm"),))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("hf_paged:request_queue_time_seconds_count") == 3  # requests, not choices
    assert delta("hf_paged:request_time_per_output_token_seconds_count") == 4  # 3 forks of 4 tokens + 6 tokens
    assert delta("hf_paged:e2e_request_latency_seconds_count") == 5  # choices
    assert delta("hf_paged:request_queue_time_seconds_sum") >= 0


def test_metrics_agree_with_the_usage_of_a_mixed_workload():
    """Completions and chat, streamed and not, n=2, a stop string, a JSON schema, a repeated prompt (prefix hit):
    the /metrics deltas equal what the responses' `usage` and finish reasons add up to (a prompt of n choices
    counts n times in prompt_tokens_total, once in usage)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    work = [
        ("/v1/completions", {"prompt": "hello world " * 5, "max_tokens": 7, "ignore_eos": True}),
        ("/v1/completions", {"prompt": "hello world " * 5, "max_tokens": 7, "ignore_eos": True}),
        ("/v1/completions", {"prompt": "the fox " * 4, "max_tokens": 5, "n": 2, "ignore_eos": True, "seed": 1,
                             "temperature": 1.0}),
        ("/v1/completions", {"prompt": "a b c d e f", "max_tokens": 30, "stop": [" "], "temperature": 0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "n": 2,
                                  "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "json"}], "max_tokens": 12, "temperature": 0,
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "x", "schema": schema}}}),
    ]
    server, engine = make_server(default_model())
    prompt = completion = cached = choices = 0
    reasons: dict[str, int] = {}
    with server:
        before = samples(httpx.get(server.url + "/metrics").text)
        for path, body in work:
            n = body.get("n", 1)
            if body.get("stream"):
                with httpx.stream("POST", server.url + path, json=body, timeout=120) as response:
                    chunks = [json.loads(line[6:]) for line in response.iter_lines()
                              if line.startswith("data: {")]
                usage = chunks[-1]["usage"]
                finished = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
            else:
                answer = httpx.post(server.url + path, json=body, timeout=120).json()
                usage, finished = answer["usage"], [c["finish_reason"] for c in answer["choices"]]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            prompt += n * usage["prompt_tokens"]
            completion += usage["completion_tokens"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            choices += n
            for reason in finished:
                reasons[reason] = reasons.get(reason, 0) + 1
        wait_idle(engine)
        after = samples(httpx.get(server.url + "/metrics").text)

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted({"model_name": "tiny-lm", **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert cached > 0 and reasons.get("stop", 0) >= 1  # the repeated prompt hit; the stop string ended one
    assert delta("hf_paged:prompt_tokens_total") == prompt
    assert delta("hf_paged:generation_tokens_total") == completion
    assert delta("hf_paged:prefix_cache_hits_total") == cached
    for name in ("request_added_total", "request_finished_total", "time_to_first_token_seconds_count",
                 "e2e_request_latency_seconds_count"):
        assert delta(f"hf_paged:{name}") == choices, name
    assert delta("hf_paged:request_time_per_output_token_seconds_count") == choices  # each made 2+ tokens (greedy)
    assert delta("hf_paged:request_queue_time_seconds_count") == len(work)
    for reason, count in reasons.items():
        assert delta("hf_paged:request_success_total", finished_reason=reason) == count
    assert delta("hf_paged:num_requests_running") == delta("hf_paged:num_requests_waiting") == 0
    assert after[("hf_paged:kv_cache_used_blocks", (("model_name", "tiny-lm"),))] == 0


def test_echo_scoring_choices_count_as_successes():
    """Scoring (`echo: true, max_tokens: 0`, lm-eval's loglikelihood traffic) answers choices ending "length":
    request_success and the e2e / queue histograms count them, as they count generated choices (they counted
    none: an lm-eval run left request_success_total at 0)."""
    server, engine = make_server(default_model())
    with server:
        before = samples(httpx.get(server.url + "/metrics").text)
        answer = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": ["score this", "and this one"], "max_tokens": 0, "echo": True, "logprobs": 0})
        wait_idle(engine)
        after = samples(httpx.get(server.url + "/metrics").text)
    assert [c["finish_reason"] for c in answer.json()["choices"]] == ["length", "length"]
    usage = answer.json()["usage"]

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted({"model_name": "tiny-lm", **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("hf_paged:request_success_total", finished_reason="length") == 2
    assert delta("hf_paged:e2e_request_latency_seconds_count") == 2
    assert delta("hf_paged:request_queue_time_seconds_count") == 2
    assert delta("hf_paged:request_finished_total") == 2
    assert delta("hf_paged:time_to_first_token_seconds_count") == 0  # nothing generated
    # the scored texts' tokens, as usage counts them (the engine is given each prompt but its last token, a target)
    assert delta("hf_paged:prompt_tokens_total") == usage["prompt_tokens"] == 11 + 13
