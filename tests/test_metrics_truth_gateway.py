"""The Ray gateway's own error answers in its /metrics (h75), without a cluster: the gateway object is driven
directly with a stand-in for its replicas' handle (as tests/scaleout/test_gateway_parts.py does)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hf_paged.scaleout.metrics_merge import render_scrape
from tests.scaleout.fake_serve import FakeHandle, ReplicaAnswer


def test_rejections_render_as_one_counter_family_by_status():
    text = render_scrape([RuntimeError("no replica")], rejected={503: 2, 401: 1})
    family = {f.name: f for f in text_string_to_metric_families(text)}["hf_paged:gateway_requests_rejected"]
    assert family.type == "counter" and family.documentation
    assert {s.labels["status"]: s.value for s in family.samples} == {"401": 1.0, "503": 2.0}


def test_the_gateway_counts_the_errors_it_answers_itself_not_a_replica_s():
    """A 401 at the gateway's key check and a 503 while draining count in gateway_requests_rejected_total; a
    replica's own 400 (it names the replica) does not: that replica's request_rejected_total has it. Before,
    the gateway's own errors were counted nowhere."""
    pytest.importorskip("ray")
    from starlette.requests import Request

    from hf_paged.scaleout.gateway import Gateway
    from hf_paged.scaleout.spec import ReplicaSpec
    from hf_paged.serving.auth import KeyCheck

    # a replica answering 400 with its name in the header
    handle = FakeHandle(lambda call: ReplicaAnswer(400, ((b"x-hf-paged-replica", b"r1"),)))
    gateway = Gateway(handle, ReplicaSpec(api_key=KeyCheck.from_key("k")), wait_for_reports=False)

    def answer(path, headers=()):
        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), *headers]}
        return asyncio.run(gateway(Request(scope, receive)))

    assert answer("/v1/completions").status_code == 401
    assert answer("/v1/completions", [(b"authorization", b"Bearer k")]).status_code == 400  # the replica's
    asyncio.run(gateway.begin_drain())
    assert answer("/v1/completions", [(b"authorization", b"Bearer k")]).status_code == 503
    text = asyncio.run(gateway.scrape())
    family = {f.name: f for f in text_string_to_metric_families(text)}["hf_paged:gateway_requests_rejected"]
    assert {s.labels["status"]: s.value for s in family.samples} == {"401": 1.0, "503": 1.0}
