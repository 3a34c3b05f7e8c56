"""The gateway's readiness (issue 37): `GET /v1/models` and `/health` answer 503 (OpenAI-style error, Retry-After)
until every engine replica is in the router's view with a first report; other requests wait for it, bounded.

Here without Ray Serve: the gateway's door against a fake router view. On a real local Ray cluster, in
tests/scaleout/test_ray_serve.py (sharing that module's cluster and app start): the app started without waiting for
its replicas, probed until the first 200, and the router's view then holds both replicas with their reports; a chat
sent before readiness waits and is answered.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")

from starlette.requests import Request

from hf_paged.scaleout import registry
from hf_paged.scaleout.drain import DrainGate
from hf_paged.scaleout.gateway import Gateway
from hf_paged.scaleout.ray_router import ViewReadiness


@dataclass(eq=False)  # hashable: the registry is a weak set
class FakeRouterView:
    num_known: int = 0
    num_reported: int = 0
    deployment_id: str | None = None

    def view_readiness(self) -> ViewReadiness:
        return ViewReadiness(self.num_known, self.num_reported, self.deployment_id)

    def snapshot(self) -> dict:
        return {"replicas": {}, "routed": {}, "event_gaps": 0}


def gateway_for(num_replicas: int, ready_wait_s: float) -> Gateway:
    gateway = object.__new__(Gateway)  # no Serve handle, no tokenizer: only the door
    gateway.engine = object()  # no deployment id: every router in the process counts
    gateway.gate = DrainGate()
    gateway.num_replicas, gateway.wait_for_reports, gateway._ready = num_replicas, True, False
    gateway.ready_wait_s, gateway.num_rejected = ready_wait_s, {}
    return gateway


def request(method: str, path: str, body: bytes = b"") -> Request:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "scheme": "http", "server": ("t", 80),
             "client": ("c", 1), "root_path": ""}
    return Request(scope, receive)


@pytest.fixture
def view():
    router = FakeRouterView()
    registry.register(router)  # a weak set: the fixture holds it
    yield router
    registry._ROUTERS.discard(router)


def test_probes_answer_503_with_retry_after_until_every_replica_reported(view):
    gateway = gateway_for(num_replicas=2, ready_wait_s=60.0)  # a probe that waited would take a minute
    view.num_known, view.num_reported = 2, 1
    for path in ("/v1/models", "/health"):
        started = time.monotonic()
        response = asyncio.run(gateway(request("GET", path)))
        assert time.monotonic() - started < 30, "a probe must not wait for readiness"  # (generous: a loaded machine)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        error = json.loads(response.body)["error"]
        assert error["code"] == "not_ready" and error["type"] == "service_unavailable_error" and error["param"] is None
        assert "1 of 2 engine replicas have reported" in error["message"] and "(2 known)" in error["message"]
    assert gateway.gate.num_in_flight == 0


def test_a_request_before_readiness_waits_bounded_then_503(view):
    gateway = gateway_for(num_replicas=2, ready_wait_s=0.3)
    view.num_known = 2
    started = time.monotonic()
    response = asyncio.run(gateway(request("POST", "/v1/chat/completions", b'{"messages": []}')))
    waited = time.monotonic() - started
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert json.loads(response.body)["error"]["code"] == "not_ready"
    assert 0.3 <= waited < 30  # bounded (the upper bound generous: CI shares its cores)
    assert gateway.gate.num_in_flight == 0


def test_the_router_view_and_metrics_paths_answer_before_readiness(view):
    gateway = gateway_for(num_replicas=2, ready_wait_s=60.0)  # a path that waited would take a minute
    started = time.monotonic()
    response = asyncio.run(gateway(request("GET", "/hf_paged/router")))
    assert response.status_code == 200 and time.monotonic() - started < 30
    assert {"replicas": {}, "routed": {}, "event_gaps": 0} in json.loads(response.body)


def test_readiness_needs_every_replica_known_and_reported_then_latches(view):
    gateway = gateway_for(num_replicas=2, ready_wait_s=0.0)
    assert not gateway.readiness().ready  # nothing known
    view.num_known, view.num_reported = 1, 1
    assert not gateway.readiness().ready  # one replica of two
    view.num_known = 2
    state = gateway.readiness()
    assert not state.ready and (state.num_known, state.num_reported) == (2, 1)
    view.num_reported = 2
    assert gateway.readiness().ready
    view.num_known = view.num_reported = 1  # a replica replaced later: routed by load until it reports
    assert gateway.readiness().ready


def test_only_the_router_of_the_gateways_own_deployment_counts(view):
    gateway = gateway_for(num_replicas=2, ready_wait_s=0.0)
    gateway.engine = type("Handle", (), {"deployment_id": "decode"})()
    other = FakeRouterView(2, 2, deployment_id="prefill")  # e.g. the prefill replicas' router under disaggregation
    registry.register(other)
    try:
        view.num_known, view.num_reported, view.deployment_id = 2, 1, "decode"
        assert not gateway.readiness().ready
        view.num_reported = 2
        assert gateway.readiness().ready
    finally:
        registry._ROUTERS.discard(other)


def test_wait_ready_returns_as_soon_as_the_last_replica_reports(view):
    gateway = gateway_for(num_replicas=2, ready_wait_s=0.0)
    view.num_known, view.num_reported = 2, 1

    async def run():
        async def report_later():
            await asyncio.sleep(0.2)
            view.num_reported = 2
        task = asyncio.ensure_future(report_later())
        started = time.monotonic()
        state = await gateway.wait_ready(60.0)  # returning at its timeout would take a minute
        await task
        return state, time.monotonic() - started

    state, waited = asyncio.run(run())
    assert state.ready and 0.2 <= waited < 30


def test_the_router_counts_a_replica_reported_once_its_stats_hold_a_summary():
    from hf_paged.scaleout.ray_router import HfPagedRequestRouter

    @dataclass(frozen=True)
    class FakeId:
        unique_id: str

    @dataclass
    class FakeReplica:
        replica_id: FakeId
        routing_stats: dict

    router = object.__new__(HfPagedRequestRouter)  # no Serve controller: only the state our methods use
    router.initialize_state(block_size=4)
    router._replicas = {FakeId("a"): FakeReplica(FakeId("a"), {}), FakeId("b"): FakeReplica(FakeId("b"), {"seq": 1})}
    router._deployment_id = "d"
    assert router.view_readiness() == ViewReadiness(num_known=2, num_reported=1, deployment_id="d")
