"""The Ray-free parts of the deployment: the in-process ASGI bridge and the gateway's prompt key."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoTokenizer

from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.scaleout import prompt_fingerprints
from hf_paged.scaleout.asgi import HttpCall, ResponseStart, forward
from hf_paged.scaleout.prompt_key import prompt_ids, routing_info
from hf_paged.serving.protocol import ChatCompletionRequest, CompletionRequest
from tests.scaleout.fake_serve import FakeHandle, ReplicaAnswer


def collect(app, call):
    async def run():
        return [item async for item in forward(app, call)]

    return asyncio.run(run())


def test_forward_streams_the_apps_response():
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        data = json.loads(await request.body())
        return JSONResponse({"got": data, "q": request.url.query}, status_code=201, headers={"x-a": "1"})

    @app.get("/stream")
    async def stream():
        async def parts():
            for i in range(3):
                yield f"part{i};"

        return StreamingResponse(parts(), media_type="text/event-stream")

    items = collect(app, HttpCall("POST", "/echo", b"k=v", ((b"content-type", b"application/json"),), b'{"x": 1}'))
    start, body = items[0], b"".join(items[1:])
    assert isinstance(start, ResponseStart) and start.status == 201 and (b"x-a", b"1") in start.headers
    assert json.loads(body) == {"got": {"x": 1}, "q": "k=v"}
    items = collect(app, HttpCall("GET", "/stream"))
    assert items[0].status == 200 and b"".join(items[1:]) == b"part0;part1;part2;"
    assert collect(app, HttpCall("GET", "/nope"))[0].status == 404


def test_closing_early_tells_the_app_the_client_left():
    seen = {}

    async def app(scope, receive, send):  # answers a first chunk, then waits for the client, as build_app does
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first;", "more_body": True})
        seen["next"] = (await receive())["type"]

    async def run():
        gen = forward(app, HttpCall("GET", "/slow"))
        assert isinstance(await gen.__anext__(), ResponseStart)
        assert await gen.__anext__() == b"first;"
        await gen.aclose()  # the gateway's client went away

    asyncio.run(asyncio.wait_for(run(), timeout=10))
    assert seen == {"next": "http.disconnect"}


def test_an_app_that_fails_before_answering_raises():
    async def app(scope, receive, send):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        collect(app, HttpCall("GET", "/"))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH, local_files_only=True)


def test_prompt_key_tokenizes_as_the_replicas_preparer(tokenizer):
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "max_tokens": 7}
    ids, output, _n = prompt_ids("/v1/chat/completions", json.dumps(chat).encode(), tokenizer)
    messages = [{**m.model_dump(exclude_none=True), "content": m.text()}
                for m in ChatCompletionRequest.model_validate(chat).messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"] and output == 7
    completion = {"prompt": "hello world", "max_tokens": 3}
    ids, output, _n = prompt_ids("/v1/completions", json.dumps(completion).encode(), tokenizer)
    assert ids == tokenizer(CompletionRequest.model_validate(completion).prompts()[0])["input_ids"] and output == 3
    assert prompt_ids("/v1/completions", json.dumps({"prompt": [5, 6, 7], "n": 2}).encode(), tokenizer) == (
        [5, 6, 7], 16, 2)


def test_routing_info_digests_the_prompt_and_gives_up_quietly(tokenizer):
    body = json.dumps({"prompt": list(range(40)), "max_tokens": 5}).encode()
    info = routing_info("/v1/completions", body, tokenizer, block_size=16, extra_keys=("salt",))
    assert info.fingerprints == tuple(prompt_fingerprints(list(range(40)), 16, ("salt",)))
    assert (info.num_prompt_tokens, info.num_output_tokens) == (40, 5)
    for bad in (b"not json", b"[]", json.dumps({"messages": "x"}).encode()):
        assert routing_info("/v1/chat/completions", bad, tokenizer, 16) is None  # the replica answers the 400


def test_routing_info_counts_what_a_request_can_generate_and_skips_what_cannot_fit(tokenizer):
    """A `max_tokens` of 1e12 (refused by the replica) booked 1e12 tokens of work on its replica: every later
    request went elsewhere. Now: at most the room after the prompt, times n. A text longer than any prompt the
    model takes is routed by load untokenized (9 MB of text held the gateway's event loop for ~10 s)."""
    body = json.dumps({"prompt": list(range(40)), "max_tokens": 10**12, "n": 3}).encode()
    info = routing_info("/v1/completions", body, tokenizer, 16, max_model_len=2048)
    assert (info.num_prompt_tokens, info.num_output_tokens) == (40, 3 * (2048 - 40))
    chat = json.dumps({"messages": [{"role": "user", "content": "x" * 101}]}).encode()
    assert routing_info("/v1/chat/completions", chat, tokenizer, 16, max_chars=100) is None
    assert routing_info("/v1/completions", json.dumps({"prompt": "x" * 101}).encode(), tokenizer, 16,
                        max_chars=100) is None
    assert routing_info("/v1/completions", json.dumps({"prompt": "x" * 99}).encode(), tokenizer, 16,
                        max_chars=100) is not None


def test_gateway_scrape_labels_every_replica_and_skips_a_failed_one():
    pytest.importorskip("ray")
    from hf_paged.scaleout.deploy import EngineReplica, Gateway, ReplicaSpec
    from hf_paged.scaleout.metrics_merge import ReplicaMetrics, parse_exposition

    spec = ReplicaSpec(paged={"block_size": 16, "num_blocks": 64})
    replica = EngineReplica(spec)  # outside Serve: its tag is "local"
    try:
        own = asyncio.run(replica.metrics(timeout_s=30))
        assert isinstance(own, ReplicaMetrics) and own.replica == "local"
        assert any(f.name == "hf_paged:num_requests_running" for f in parse_exposition(own.text))

        class Broadcast:  # what `DeploymentHandle.broadcast(...)` gives: one answer per live replica, any order
            def __init__(self, kwargs):
                self.kwargs = kwargs

            async def results_async(self, *, timeout_s, return_exceptions):
                assert return_exceptions and timeout_s > self.kwargs["timeout_s"]
                other = ReplicaMetrics("r2", own.text)
                return [other, RuntimeError("replica r3 died"), await replica.metrics(**self.kwargs)]

        class Handle:
            def options(self, **_):
                return self

            def broadcast(self, method, **kwargs):
                assert method == "metrics"
                return Broadcast(kwargs)

        text = asyncio.run(Gateway(Handle(), spec).scrape())
    finally:
        replica.engine.loop.shutdown()
    running = [line for line in text.splitlines() if line.startswith("hf_paged:num_requests_running")]
    assert [line.split("replica=")[1].split("}")[0] for line in running] == ['"local"', '"r2"']
    assert text.count("# TYPE hf_paged:num_requests_running gauge") == 1
    assert "hf_paged:metrics_replicas_scraped 2.0" in text and "hf_paged:metrics_scrape_errors 1.0" in text


def test_drain_gate_counts_a_stream_until_it_ends_and_refuses_once_closed():
    from hf_paged.scaleout.drain import DrainGate

    gate = DrainGate()

    async def body():
        yield b"a"
        yield b"b"

    async def run():
        assert gate.admit() and gate.admit()
        gate.done()  # a plain answer: done when returned
        stream = gate.track(body())
        assert [chunk async for chunk in stream] == [b"a", b"b"]
        assert gate.num_in_flight == 0
        assert gate.admit()
        cut = gate.track(body())
        assert await cut.__anext__() == b"a"
        assert gate.close() == 1 and not gate.admit()  # closed: nothing new counted
        await cut.aclose()  # the client went away mid-stream
        assert gate.num_in_flight == 0

    asyncio.run(run())
    with pytest.raises(RuntimeError, match="without a matching admit"):
        gate.done()


def test_gateway_refuses_a_request_without_the_api_key_before_routing_it():
    """`serve --replicas N --api-key K`: the gateway (the cluster's only HTTP face) answers 401 with the single
    server's body to a request without the key, before reading, tokenizing or forwarding it; /health and /metrics
    stay open. Was: the flag was refused with --replicas."""
    pytest.importorskip("ray")
    from starlette.requests import Request

    from hf_paged.scaleout.gateway import Gateway
    from hf_paged.scaleout.spec import ReplicaSpec
    from hf_paged.serving.auth import KeyCheck

    forwarded = []

    def respond(call):
        forwarded.append(call.path)
        return ReplicaAnswer(200)

    gateway = Gateway(FakeHandle(respond), ReplicaSpec(api_key=KeyCheck.from_key("s3cret")), wait_for_reports=False)

    def answer(path, headers=()):
        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        scope = {"type": "http", "method": "POST" if path.startswith("/v1") else "GET", "path": path,
                 "query_string": b"", "headers": [(b"content-type", b"application/json"), *headers]}
        return asyncio.run(gateway._answer(Request(scope, receive)))

    refused = answer("/v1/models")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert json.loads(refused.body)["error"]["code"] == "invalid_api_key"
    assert answer("/hf_paged/router").status_code == 401  # the router's state is not public either
    assert answer("/v1/models", [(b"authorization", b"Bearer wrong")]).status_code == 401
    assert forwarded == []
    assert answer("/v1/models", [(b"authorization", b"Bearer s3cret")]).status_code == 200
    assert answer("/health").status_code == 200
    assert forwarded == ["/v1/models", "/health"]


def test_worker_env_adds_a_checkout_to_the_workers_path_but_not_an_installed_package(monkeypatch):
    """From a wheel, hf_paged sits in site-packages, which Ray's workers import from already: putting it on
    PYTHONPATH placed it before the standard library."""
    pytest.importorskip("ray")
    import site
    from pathlib import Path

    from hf_paged.scaleout import deploy

    root = Path(deploy.__file__).resolve().parents[2]
    monkeypatch.setattr(site, "getsitepackages", lambda: ["/nowhere/site-packages"])
    assert deploy.worker_env()["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == str(root)  # this checkout
    monkeypatch.setattr(site, "getsitepackages", lambda: ["/nowhere/site-packages", str(root)])
    assert deploy.worker_env() == {}
