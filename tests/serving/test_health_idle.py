"""/health's batch utilisation reads idle on an idle server (h77): a read that finds no engine step since the last
read and nothing running or waiting restarts its window, so the last busy figure does not stay for ever. A real
server on 127.0.0.1 (an ephemeral port)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
import httpx

from hf_paged import default_model
from tests.serving.conftest import make_server, wait_idle


def batch_check(url: str) -> dict:
    return httpx.get(url + "/health", params={"detail": 1}, timeout=60).json()["checks"]["batch_utilization"]


def test_an_idle_server_reads_idle_and_a_busy_one_counts_only_its_new_steps():
    server, engine = make_server(default_model())
    with server:
        body = {"prompt": "hello there", "max_tokens": 6, "ignore_eos": True}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=120).status_code == 200
        wait_idle(engine)
        busy = batch_check(server.url)
        steps = engine.stats()["steps"]
        assert busy["value"] is not None
        idle = batch_check(server.url)  # no step since the last read, nothing running: idle
        assert idle["value"] is None and idle["holds"] is None
        assert busy["steps"] == steps > 0 and idle["steps"] == 0
        assert batch_check(server.url)["value"] is None  # and it stays idle
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=120).status_code == 200
        wait_idle(engine)
        again = batch_check(server.url)
        new_steps = engine.stats()["steps"] - steps
        recent = list(engine.metrics.recent_step_tokens)[-new_steps:]
        assert again["steps"] == new_steps and again["value"] == pytest.approx(
            sum(recent) / (new_steps * engine.config.max_num_batched_tokens))
        text = httpx.get(server.url + "/metrics", timeout=60).text  # a scrape is a read too: idle again
        assert batch_check(server.url)["value"] is None
        assert "hf_paged:batch_utilization" in text
