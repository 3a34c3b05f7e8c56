"""N engine replicas on Ray Serve behind one OpenAI-compatible endpoint (needs `hf_paged[ray]`).

    client --HTTP--> Serve proxy --> Gateway (1 replica: tokenizes the prompt to route it, streams the answer back)
                                       | handle.forward.remote(HttpCall, routing=RoutingInfo)   HfPagedRequestRouter
                                       v                                                          (in the gateway)
                                     EngineReplica x N: the `hf-paged serve` FastAPI app, in-process (asgi.forward)
                                       record_routing_stats() -> CacheSummary, every `stats_period_s`

The endpoints are the single-server ones (`hf_paged.serving.build_app`), served by each replica; the gateway
forwards any path. Why a gateway: Serve's HTTP proxy routes before the request body arrives, so a router there
cannot see the prompt. A replica that dies before sending anything is retried once on another replica; one that
dies mid-answer ends the answer with an error (an SSE error event, or a cut body). `GET /hf_paged/router` shows the
router's view (replicas, loads, reports, choices by reason). Every answer names its replica in an `x-hf-paged-replica`
header. `GET /metrics` reports every live replica, each sample with a `replica` label (`DeploymentHandle.broadcast`
of `EngineReplica.metrics`, merged by `metrics_merge.py`), plus the gateway's own gauges; a replica that fails or takes
longer than `scrape_timeout_s` is left out and counted in `hf_paged:metrics_scrape_errors`.

    hf_paged.scaleout.deploy.deploy(model_path, replicas=2)      # returns the Serve app handle; HTTP on :8000
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from hf_paged.scaleout.asgi import HttpCall, ResponseStart, forward
from hf_paged.scaleout.drain import DrainGate
from hf_paged.scaleout.metrics_merge import CONTENT_TYPE, ReplicaMetrics, render_scrape
from hf_paged.scaleout.prompt_key import routing_info
from hf_paged.scaleout.ray_router import HfPagedRequestRouter

__all__ = ["EngineReplica", "Gateway", "ReplicaSpec", "build_application", "deploy", "worker_env"]

logger = logging.getLogger("hf_paged.scaleout")

_ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions")
_DEAD = (ActorDiedError, ActorUnavailableError, RayActorError)


@dataclass(slots=True)
class ReplicaSpec:
    """What every engine replica loads and how it runs (plain data: it is pickled to each replica)."""

    model: str | None = None  # a local model directory or hub id; None: the embedded tiny model
    served_model_name: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    paged: dict[str, Any] = field(default_factory=dict)  # PagedConfig fields (block_size, num_blocks, ...)
    max_waiting: int | None = None
    chat_template: str | None = None  # a Jinja template (the text) replacing the tokenizer's
    summary_limit: int | None = None  # most fingerprints per routing summary (None: the whole pool, never cut)
    torch_threads: int | None = None  # torch.set_num_threads in each replica (None: leave it)

    @property
    def model_path(self) -> str:
        from hf_paged.models import DEFAULT_MODEL_PATH

        return self.model or str(DEFAULT_MODEL_PATH)

    @property
    def name(self) -> str:
        return self.served_model_name or (self.model or "hf-paged/tiny-lm")

    @property
    def block_size(self) -> int:
        from hf_paged.config import PagedConfig

        return PagedConfig(**self.paged).block_size

    @property
    def extra_keys(self) -> tuple:
        salt = self.paged.get("cache_salt")
        return (salt,) if salt else ()


class EngineReplica:
    """One engine, its loop thread and the single-server FastAPI app; reports its cache for routing."""

    def __init__(self, spec: ReplicaSpec) -> None:
        import queue

        from hf_paged.batching.engine import Engine
        from hf_paged.cli_common import load_model
        from hf_paged.config import PagedConfig
        from hf_paged.scaleout.replica import ReplicaReporter
        from hf_paged.serving import ServerSettings, build_app

        if spec.torch_threads:
            import torch

            torch.set_num_threads(spec.torch_threads)
        ready: queue.SimpleQueue = queue.SimpleQueue()

        def engine_thread() -> None:  # model load and every step in one thread, as `hf-paged serve` does
            try:
                model, tokenizer = load_model(spec.model_path, spec.device, spec.dtype)
                engine = Engine(model, PagedConfig(**spec.paged))
            except BaseException as exc:  # noqa: BLE001 -- re-raised in __init__
                ready.put(exc)
                return
            engine.loop.run_in_this_thread(on_ready=lambda: ready.put((engine, tokenizer)))

        threading.Thread(target=engine_thread, name="hf_paged-engine-loop", daemon=True).start()
        item = ready.get()
        if isinstance(item, BaseException):
            raise item
        self.engine, tokenizer = item
        if spec.chat_template is not None:
            tokenizer.chat_template = spec.chat_template
        self.app = build_app(self.engine, tokenizer, ServerSettings(model_name=spec.name,
                                                                    max_waiting=spec.max_waiting))
        self.reporter = ReplicaReporter(self.engine, limit=spec.summary_limit)
        try:
            self.tag = str(serve.get_replica_context().replica_id.unique_id)
        except Exception:  # noqa: BLE001 -- built outside Serve (tests)
            self.tag = "local"

    async def forward(self, call: HttpCall, routing: Any = None):
        """Serve one HTTP request through the app; yields `ResponseStart` (with an `x-hf-paged-replica` header
        naming this replica), then body chunks."""
        async for item in forward(self.app, call):
            if isinstance(item, ResponseStart):
                item = ResponseStart(item.status, [*item.headers, (b"x-hf-paged-replica", self.tag.encode())])
            yield item

    async def metrics(self, timeout_s: float = 5.0) -> ReplicaMetrics:
        """This replica's `/metrics` text (the gateway merges every replica's). Bounded by `timeout_s`: the
        engine figures wait for the step in progress, and a scrape must not."""
        async def render() -> str:
            items = [item async for item in forward(self.app, HttpCall("GET", "/metrics"))]
            if not isinstance(items[0], ResponseStart) or items[0].status != 200:
                raise RuntimeError(f"replica {self.tag}: /metrics answered {items[0]!r}")
            return b"".join(items[1:]).decode()

        return ReplicaMetrics(self.tag, await asyncio.wait_for(render(), timeout_s))

    def record_routing_stats(self) -> dict[str, Any]:
        return self.reporter.summary().to_stats()

    def abort_all(self) -> None:
        """Abort every request (the shutdown's deadline passed): each client gets the single server's 503 error."""
        self.engine.loop.abort_all()

    def check_health(self) -> None:
        if not self.engine.loop.is_alive:
            raise RuntimeError("the engine loop stopped")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.loop.shutdown()


class Gateway:
    """The HTTP ingress: finds the prompt, forwards the request to the replica the router picks, streams back."""

    scrape_timeout_s = 5.0  # each replica's bound on its `/metrics`; the whole scrape gets 2 s more (Prometheus: 10 s)

    def __init__(self, engine: Any, spec: ReplicaSpec) -> None:
        from transformers import AutoTokenizer

        self.engine = engine.options(stream=True)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
        if spec.chat_template is not None:
            self.tokenizer.chat_template = spec.chat_template  # the same prompt text as the replicas render
        self.block_size, self.extra_keys = spec.block_size, spec.extra_keys
        self.gate = DrainGate()  # closed by the driver at shutdown (`begin_drain`)

    async def __call__(self, request: Request) -> Response:
        if not self.gate.admit():
            return _error(503, "the server is shutting down; retry on another server", "shutting_down")
        try:
            response = await self._answer(request)
        except BaseException:
            self.gate.done()
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self.gate.track(response.body_iterator)
        else:
            self.gate.done()
        return response

    async def begin_drain(self) -> int:
        """Refuse new requests from now on (HTTP 503); returns the number in flight."""
        return self.gate.close()

    async def num_in_flight(self) -> int:
        return self.gate.num_in_flight

    async def abort_all(self) -> None:
        """Abort every replica's requests; their answers end with the single server's error."""
        await self.engine.broadcast("abort_all").results_async(timeout_s=self.scrape_timeout_s, return_exceptions=True)

    async def _answer(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        if path == "/hf_paged/router" and request.method == "GET":
            from hf_paged.scaleout import registry

            return JSONResponse([router.snapshot() for router in registry.routers()])
        if path == "/metrics" and request.method == "GET":
            return Response(await self.scrape(), media_type=CONTENT_TYPE)
        call = HttpCall(request.method, path, request.url.query.encode(), tuple(request.headers.raw), body)
        routing = None
        if request.method == "POST" and path in _ROUTED_PATHS:
            routing = routing_info(path, body, self.tokenizer, self.block_size, self.extra_keys)
        for attempt in range(2):
            stream = self.engine.forward.remote(call, routing=routing)
            try:
                start = await stream.__anext__()
            except _DEAD as exc:  # nothing sent yet: the request is safe to try on another replica
                logger.warning("replica died before answering %s (attempt %d): %s", path, attempt + 1, exc)
                continue
            except StopAsyncIteration:
                break
            assert isinstance(start, ResponseStart)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.headers
                       if k.lower() not in (b"content-length", b"transfer-encoding")}
            return StreamingResponse(_rest(stream, headers.get("content-type", "")), status_code=start.status,
                                     headers=headers)
        return _error(503, "no replica could take the request (the one tried stopped); retry", "replica_lost")

    async def scrape(self) -> str:
        """Every live replica's metrics, labelled by replica, and the gateway's own; never waits past the bound.

        Each replica bounds its own answer (`scrape_timeout_s`), so a slow one is left out alone; the outer bound is
        a backstop for a replica whose event loop is stuck, and then the whole scrape reports no replica (errors 1).
        """
        from hf_paged.scaleout import registry

        results: list[ReplicaMetrics | BaseException]
        try:
            response = self.engine.broadcast("metrics", timeout_s=self.scrape_timeout_s)
            results = await response.results_async(timeout_s=self.scrape_timeout_s + 2.0, return_exceptions=True)
        except Exception as exc:  # noqa: BLE001 -- no replica running, or one stuck past its own bound
            logger.warning("metrics scrape failed as a whole: %r", exc)
            results = [exc]
        routers = registry.routers()
        routed = None
        if routers:  # the cache-aware router (Serve's own pow2 router keeps no such counts)
            routed = {}
            for router in routers:
                for reason, n in router.snapshot()["routed"].items():
                    routed[reason] = routed.get(reason, 0) + n
        return render_scrape(results, routed=routed)


async def _rest(stream: Any, content_type: str):
    """The body after the start; a replica lost mid-answer ends it with an error the client can parse."""
    try:
        async for chunk in stream:
            yield chunk
    except _DEAD:
        message = "the replica serving this request stopped mid-answer; retry"
        if content_type.startswith("text/event-stream"):
            yield b'data: {"error": {"message": "' + message.encode() + b'", "type": "server_error", ' \
                  b'"param": null, "code": "replica_lost"}}\n\ndata: [DONE]\n\n'
        else:
            raise  # the status line is sent: the client sees a truncated body, never a hang


def _error(status: int, message: str, code: str) -> Response:
    import json

    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return Response(json.dumps(body), status_code=status, media_type="application/json")


def worker_env() -> dict:
    """A runtime env that lets Ray's workers import this hf_paged (an editable checkout is not on their path).
    On a multi-node cluster install hf_paged on every node instead."""
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def build_application(spec: ReplicaSpec, *, replicas: int = 2, router: str = "cache_aware",
                      router_kwargs: dict | None = None, stats_period_s: float = 1.0,
                      max_ongoing_requests: int = 64, replica_num_cpus: float = 1.0) -> Any:
    """The Serve application: `replicas` engine replicas behind a gateway, routed by `HfPagedRequestRouter`
    (`router="cache_aware"`) or by Ray Serve's default power of two choices (`router="pow2"`, for comparison)."""
    if router not in ("cache_aware", "pow2"):
        raise ValueError(f"router must be 'cache_aware' or 'pow2', got {router!r}")
    options: dict[str, Any] = {}
    if router == "cache_aware":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=HfPagedRequestRouter,
            request_router_kwargs={"block_size": spec.block_size, **(router_kwargs or {})},
            request_routing_stats_period_s=stats_period_s,
        )
    options["graceful_shutdown_wait_loop_s"] = 0.2  # the CLI drains first (cli.drain): Serve's 2 s polls only add
    engine = serve.deployment(EngineReplica, name="EngineReplica", num_replicas=replicas,
                              max_ongoing_requests=max_ongoing_requests,
                              ray_actor_options={"num_cpus": replica_num_cpus}, **options).bind(spec)
    gateway = serve.deployment(Gateway, name="Gateway", num_replicas=1, max_ongoing_requests=10_000,
                               ray_actor_options={"num_cpus": 0}, graceful_shutdown_wait_loop_s=0.2)
    return gateway.bind(engine, spec)


def deploy(model: str | None = None, *, replicas: int = 2, address: str | None = None, host: str = "127.0.0.1",
           port: int = 8000, num_cpus: int | None = None, blocking: bool = False, router: str = "cache_aware",
           **spec_fields: Any) -> Any:
    """Start (or join, with `address`) a Ray cluster and serve `replicas` engine replicas of `model` on
    http://host:port with the single-server endpoints. Returns the app's handle (or blocks, with `blocking`).

    Example:
        >>> handle = deploy("path/to/model", replicas=2, paged={"block_size": 16})    # doctest: +SKIP
    """
    import ray

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus if address is None else None, include_dashboard=False,
                 runtime_env=worker_env())
    serve.start(http_options={"host": host, "port": port})
    spec = ReplicaSpec(model=model, **spec_fields)
    handle = serve.run(build_application(spec, replicas=replicas, router=router), name="hf_paged", route_prefix="/",
                       blocking=blocking)
    return handle
