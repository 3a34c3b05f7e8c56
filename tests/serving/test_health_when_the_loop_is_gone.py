"""/health tells a load balancer the truth once the engine loop no longer takes requests: 503 (and, with
`detail=1`, status "down"), while new completions get a 503 OpenAI error, not a hang. A real server on 127.0.0.1
(an ephemeral port). h87's mutation audit: /health answering 200 whatever the loop's state passed every test."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
import httpx

from hf_paged import default_model
from tests.serving.conftest import make_server


def test_health_is_503_and_down_once_the_loop_is_shut_down():
    server, engine = make_server(default_model())
    with server:
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        up = httpx.get(server.url + "/health", params={"detail": 1}, timeout=60).json()
        assert up["status"] == "ok" and up["engine_loop_alive"] is True
        engine.loop.shutdown()
        assert httpx.get(server.url + "/health", timeout=60).status_code == 503
        down = httpx.get(server.url + "/health", params={"detail": 1}, timeout=60)
        assert down.status_code == 503
        assert down.json()["status"] == "down" and down.json()["engine_loop_alive"] is False
        refused = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
