"""N engine replicas on Ray Serve behind one OpenAI-compatible endpoint (needs `hf_paged[ray]`).

    client --HTTP--> Serve proxy --> Gateway (1 replica: tokenizes the prompt to route it, streams the answer back)
                                       | handle.forward.remote(HttpCall, routing=RoutingInfo)   HfPagedRequestRouter
                                       v                                                          (in the gateway)
                                     EngineReplica x N: the `hf-paged serve` FastAPI app, in-process (asgi.forward)
                                       record_routing_stats() -> CacheSummary (+ block events, with
                                         `routing_events`), every `stats_period_s`

The endpoints are the single-server ones (`hf_paged.serving.build_app`), served by each replica; the gateway
(`gateway.py`) forwards any path. Why a gateway: Serve's HTTP proxy routes before the request body arrives, so a router there
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
from typing import Any

try:  # the ray extra: Ray Serve, and the serve extra's Starlette under the gateway
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from hf_paged.scaleout.gateway import Gateway
    from hf_paged.scaleout.ray_router import HfPagedRequestRouter
except ImportError as exc:
    raise ImportError(f"hf_paged.scaleout.deploy needs the ray extra ({exc.name} is missing): "
                      "pip install 'hf_paged[ray]'") from None

from hf_paged.scaleout.asgi import HttpCall, ResponseStart, forward
from hf_paged.scaleout.metrics_merge import ReplicaMetrics
from hf_paged.scaleout.spec import ReplicaSpec

__all__ = ["APP_NAME", "EngineReplica", "Gateway", "ReplicaSpec", "build_application", "deploy", "worker_env"]

APP_NAME = "hf_paged"  # the Serve application `deploy` runs (on a joined cluster, the one the command deletes at exit)


class EngineReplica:
    """One engine, its loop thread and the single-server FastAPI app; reports its cache for routing."""

    def __init__(self, spec: ReplicaSpec) -> None:
        from hf_paged.api.loading import load_model
        from hf_paged.config import PagedConfig
        from hf_paged.scaleout.replica import ReplicaReporter
        from hf_paged.scaleout.routing_stats import RoutingStats
        from hf_paged.serving import build_app
        from hf_paged.serving.engine_thread import engine_in_own_thread

        if spec.torch_threads:
            import torch

            torch.set_num_threads(spec.torch_threads)
        self.engine, tokenizer = engine_in_own_thread(
            lambda: load_model(spec.model_path, spec.device, spec.dtype), PagedConfig(**spec.paged))
        if spec.chat_template is not None:
            tokenizer.chat_template = spec.chat_template
        self.app = build_app(self.engine, tokenizer, spec.server_settings())
        self.kv_store = None
        if spec.kv_role is not None:
            from hf_paged.scaleout.kv_roles import attach_kv_role

            self.kv_store = attach_kv_role(self.engine, spec.kv_role, spec.kv_directory)
        elif spec.kv_share:
            from hf_paged.scaleout.kv_share import attach_kv_share

            self.kv_store = attach_kv_share(self.engine, spec.kv_directory, max_blocks=spec.kv_share_max_blocks)
        self.reporter = ReplicaReporter(self.engine, limit=spec.summary_limit)
        self.routing_stats = RoutingStats(self.reporter, events=spec.routing_events, summary_every=spec.summary_every)
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

    async def prefill(self, call: HttpCall, routing: Any = None) -> int:
        """Compute a prompt for a decode replica (a prefill replica; the body asks for one token, `kv_roles.py`):
        its blocks are in the object store and registered with the directory when this returns the app's status."""
        status = 0
        async for item in forward(self.app, call):
            if isinstance(item, ResponseStart):
                status = item.status
        if self.kv_store is not None:
            await self.kv_store.flush(wait=False)
        return status

    def num_used_blocks(self) -> int:
        """Blocks held by requests now (0 once every request ended or was cancelled)."""
        return self.engine.cache.pool.num_used_blocks

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
        return self.routing_stats.poll()

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


def worker_env() -> dict:
    """A runtime env that lets Ray's workers import this hf_paged (an editable checkout is not on their path);
    nothing for an installed one, whose site-packages the workers have already (on PYTHONPATH it would come before
    the standard library). On a multi-node cluster install hf_paged on every node instead."""
    import os
    import site
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root in installed:
        return {}
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def build_application(spec: ReplicaSpec, *, replicas: int = 2, router: str = "cache_aware",
                      router_kwargs: dict | None = None, stats_period_s: float = 1.0,
                      max_ongoing_requests: int = 64, replica_num_cpus: float = 1.0, prefill_replicas: int = 0) -> Any:
    """The Serve application: `replicas` engine replicas behind a gateway, routed by `HfPagedRequestRouter`
    (`router="cache_aware"`) or by Ray Serve's default power of two choices (`router="pow2"`, for comparison).
    With `prefill_replicas` (1 .. replicas - 1), that many of them only prefill and the rest decode, the KV handed
    over through Ray's object store (`kv_roles.py`, `pd_gateway.py`). `spec.kv_share`: colocated replicas publish the
    blocks of their prefix hits and load each other's (`kv_share.py`); not with `prefill_replicas`."""
    if router not in ("cache_aware", "pow2"):
        raise ValueError(f"router must be 'cache_aware' or 'pow2', got {router!r}")
    if prefill_replicas and not 0 < prefill_replicas < replicas:
        raise ValueError(f"prefill_replicas must leave at least one decode replica: 1 .. {replicas - 1} of "
                         f"{replicas} replicas, got {prefill_replicas} (0: colocated)")
    if prefill_replicas and spec.kv_share:
        raise ValueError("kv_share is for colocated replicas; with prefill_replicas the decode replicas already load "
                         "the prefill replicas' blocks: drop one of the two")
    options: dict[str, Any] = {}
    if router == "cache_aware":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=HfPagedRequestRouter,
            request_router_kwargs={"block_size": spec.block_size, **(router_kwargs or {})},
            request_routing_stats_period_s=stats_period_s,
        )
    options["graceful_shutdown_wait_loop_s"] = 0.2  # the CLI drains first (cli.drain): Serve's 2 s polls only add
    def engines(name: str, num: int, replica_spec: ReplicaSpec) -> Any:
        return serve.deployment(EngineReplica, name=name, num_replicas=num, max_ongoing_requests=max_ongoing_requests,
                                ray_actor_options={"num_cpus": replica_num_cpus}, **options).bind(replica_spec)

    def gateway(cls: type) -> Any:
        return serve.deployment(cls, name="Gateway", num_replicas=1, max_ongoing_requests=10_000,
                                ray_actor_options={"num_cpus": 0}, graceful_shutdown_wait_loop_s=0.2)

    # Ready (GET /v1/models answers) once every replica has reported to the router; Serve's own router has no view
    ready = {"num_replicas": replicas, "wait_for_reports": router == "cache_aware"}
    if not prefill_replicas:
        return gateway(Gateway).bind(engines("EngineReplica", replicas, spec), spec, **ready)
    from dataclasses import replace

    from hf_paged.scaleout.pd_gateway import DisaggGateway

    decode = engines("EngineReplica", replicas - prefill_replicas, replace(spec, kv_role="decode"))
    prefill = engines("PrefillReplica", prefill_replicas, replace(spec, kv_role="prefill"))
    # (readiness takes the most replicas one router sees: the decode deployment's)
    return gateway(DisaggGateway).bind(decode, spec, prefill, **{**ready, "num_replicas": replicas - prefill_replicas})


def deploy(model: str | None = None, *, replicas: int = 2, address: str | None = None, host: str = "127.0.0.1",
           port: int = 8000, num_cpus: int | None = None, blocking: bool = False, router: str = "cache_aware",
           prefill_replicas: int = 0, kv_share: bool = False, **spec_fields: Any) -> Any:
    """Start (or join, with `address`) a Ray cluster and serve `replicas` engine replicas of `model` on
    http://host:port with the single-server endpoints. Returns the app's handle (or blocks, with `blocking`).
    `kv_share`: the replicas share hot prefixes through Ray's object store (`kv_share.py`; off by default).

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
    spec = ReplicaSpec(model=model, kv_share=kv_share, **spec_fields)
    app = build_application(spec, replicas=replicas, router=router, prefill_replicas=prefill_replicas)
    handle = serve.run(app, name=APP_NAME, route_prefix="/", blocking=blocking)
    return handle
