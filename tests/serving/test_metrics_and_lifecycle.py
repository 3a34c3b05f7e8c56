"""/metrics in Prometheus' text format, /health and its detail, and a real `hf-paged serve` process stopped by
SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hf_paged.serving.text import TextStream
from tests.ports import free_port


def scrape(server) -> dict[str, dict]:
    text = httpx.get(server.url + "/metrics").text
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples, name, **labels):
    wanted = {"model_name": "tiny-lm", **labels}
    return next(v for k, v in samples[name].items() if dict(k).items() >= wanted.items())


def test_metrics_parse_and_count(server):
    before = scrape(server)
    prompt = "import collections\n" * 6
    for _ in range(2):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "ignore_eos": True},
                       timeout=60)
        assert r.status_code == 200
    after = scrape(server)
    for name in ("hf_paged:num_requests_running", "hf_paged:num_requests_waiting", "hf_paged:kv_cache_usage_perc",
                 "hf_paged:prefix_cache_hit_rate", "hf_paged:batch_utilization", "hf_paged:num_preemptions_total",
                 "hf_paged:time_to_first_token_seconds_count", "hf_paged:inter_token_latency_seconds_count",
                 "hf_paged:e2e_request_latency_seconds_count", "hf_paged:kv_cache_used_blocks"):
        assert name in after, name
    assert value(after, "hf_paged:generation_tokens_total") - value(before, "hf_paged:generation_tokens_total") == 16
    hits = value(after, "hf_paged:prefix_cache_hits_total") - value(before, "hf_paged:prefix_cache_hits_total")
    queries = value(after, "hf_paged:prefix_cache_queries_total") - value(before, "hf_paged:prefix_cache_queries_total")
    assert queries == 2 * (len(prompt) + 1) and hits >= len(prompt) - 32  # the second prompt came from the cache
    e2e = "hf_paged:e2e_request_latency_seconds_count"
    assert value(after, e2e) - value(before, e2e) == 2
    assert value(after, "hf_paged:request_success_total", finished_reason="length") >= 2
    assert value(after, "hf_paged:num_requests_running") == 0


def test_health_and_its_detail(server):
    assert httpx.get(server.url + "/health").status_code == 200
    detail = httpx.get(server.url + "/health", params={"detail": 1}).json()
    assert detail["status"] == "ok" and detail["engine_loop_alive"] is True
    checks = detail["checks"]
    assert set(checks) == {"prefix_hit_rate", "batch_utilization", "memory_pressure"}
    assert (checks["prefix_hit_rate"]["threshold"], checks["prefix_hit_rate"]["comparison"]) == (0.8, ">")
    assert (checks["batch_utilization"]["threshold"], checks["batch_utilization"]["comparison"]) == (0.75, ">")
    assert (checks["memory_pressure"]["threshold"], checks["memory_pressure"]["comparison"]) == (0.9, "<")
    pressure = checks["memory_pressure"]
    assert pressure["value"] == 0.0 and pressure["holds"] is True


class ByteTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_stream_holds_half_characters_and_stop_prefixes():
    stream = TextStream(ByteTokenizer(), stop=["END"])
    euro = "€".encode()
    assert stream.push([ord("a"), euro[0]]) == "a"  # half a character: held
    assert stream.push(list(euro[1:])) == "€"
    assert stream.push(list(b"xE")) == "x"  # "E" may begin "END"
    assert stream.push(list(b"N")) == ""
    assert stream.push(list(b"Dtail")) == "" and stream.stopped
    assert stream.finish() == ""
    stream = TextStream(ByteTokenizer(), stop=["END"])
    assert stream.push(list(b"abE")) == "ab"
    assert stream.finish() == "E"  # the choice ended: a stop prefix is plain text
    stream = TextStream(ByteTokenizer())
    assert stream.push([0xFF]) == ""  # an invalid byte stays invalid
    assert stream.finish() == "\ufffd"


@pytest.mark.parametrize(
    ("timeout", "body", "finishes"),
    [
        ("90", {"prompt": "def f():", "max_tokens": 32, "ignore_eos": True}, True),  # sampled: no EOS, finished in time
        ("1", {"prompt": "x", "max_tokens": 2000, "ignore_eos": True}, False),  # ~2000 steps: aborted at ~0.9 s
    ],
)
def test_sigterm_finishes_or_aborts_in_flight_requests_and_exits_0(timeout, body, finishes):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hf_paged.cli", "serve", "--port", str(port), "--shutdown-timeout", timeout,
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        result = {}

        def call(stream: bool):
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": stream}, timeout=150) as r:
                result[stream] = (r.status_code, [line for line in r.iter_lines() if line])

        threads = [threading.Thread(target=call, args=(stream,)) for stream in (False, True)]
        for t in threads:
            t.start()
        while True:  # both requests in the engine before the signal (a loaded machine may take a while to send)
            health = httpx.get(url + "/health?detail=1", timeout=5).json()
            if health["requests_running"] + health["requests_waiting"] >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=150) == 0  # (past the longest --shutdown-timeout above)
        output = proc.stdout.read().decode(errors="replace")  # (the process has ended: the pipe is at its end)
        assert "nanobind: leaked" not in output, output[-2000:]  # (a frozen heap's cycles at finalization: end_process)
        for t in threads:
            t.join(timeout=150)
        (plain_status, plain), (stream_status, events) = result[False], result[True]
        assert stream_status == 200 and events[-1] == "data: [DONE]"
        if finishes:
            assert plain_status == 200 and json.loads(plain[0])["usage"]["completion_tokens"] == 32
            assert json.loads(events[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
        else:
            assert plain_status == 503 and json.loads(plain[0])["error"]["code"] == "shutting_down"
            assert json.loads(events[-2][len("data: "):])["error"]["code"] == "shutting_down"
        assert "Traceback" not in "".join(plain + events)
        try:
            httpx.get(url + "/health", timeout=1)
            raise AssertionError("the server still answers after SIGTERM")
        except httpx.TransportError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
