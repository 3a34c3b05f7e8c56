"""Clients that leave at random points of their requests (n forks waiting, mid-prefill, mid-stream, a timed-out
non-streaming call): afterwards no request runs, no block is held, /metrics accounts for every request it added
(added = finished + aborted + failed), and the next greedy request is unchanged."""

from __future__ import annotations

import asyncio
import random

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.serving.conftest import wait_idle


def _counters(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=60).text
    wanted = {"request_added", "request_finished", "request_aborted", "request_failed"}
    out = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removeprefix("hf_paged:")
        if name in wanted:
            out[name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


async def _leave(client: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> None:
    n = (1, 2, 3)[i % 3]
    prompt = "import os\n" * 150 if i % 4 == 0 else f"story {i}: once upon a time"  # long: left during prefill
    body = {"prompt": prompt, "max_tokens": 48, "ignore_eos": True, "n": n, "stream": i % 5 != 4}
    if not body["stream"]:  # a client that times out and closes
        try:
            await client.post(url, json=body, timeout=rng.uniform(0.05, 0.5))
        except httpx.TimeoutException:
            pass
        return
    async with client.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        if i % 2:  # before any token (forks still waiting for their parent)
            await asyncio.sleep(rng.uniform(0, 0.03))
            return
        cut = rng.randint(1, 12)
        async for line in response.aiter_lines():
            cut -= line.startswith("data:")
            if cut <= 0:
                return


def test_clients_leaving_at_random_points_leave_nothing_behind(server, engine):
    greedy = {"prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0}
    before = httpx.post(server.url + "/v1/completions", json=greedy, timeout=120).json()["choices"][0]["text"]
    counts = _counters(server)

    async def run() -> None:
        rng = random.Random(0)
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
            await asyncio.gather(*[_leave(client, server.url + "/v1/completions", i, rng) for i in range(30)])

    asyncio.run(run())
    wait_idle(engine)  # no request left, no block in use, the cache's integrity holds
    assert server.app.state.server.num_admitted == 0
    after = _counters(server)
    delta = {name: after[name] - counts[name] for name in after}
    assert delta["request_added"] > 30  # (forks count: prompts x n)
    assert delta["request_added"] == delta["request_finished"] + delta["request_aborted"] + delta["request_failed"]
    assert delta["request_aborted"] > 0 and delta["request_failed"] == 0
    assert httpx.post(server.url + "/v1/completions", json=greedy, timeout=120).json()["choices"][0]["text"] == before
