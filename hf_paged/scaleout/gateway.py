"""The HTTP ingress of `hf-paged serve --replicas`: finds the prompt, forwards the request to the replica the router
picks, and streams the answer back (the deployment's shape is in `deploy.py`).

A replica that dies before sending anything is retried once on another; one that dies mid-answer ends the answer with
an error (an SSE error event, or a cut body). `GET /metrics` and `GET /hf_paged/router` are answered here. At
shutdown the driver closes the `DrainGate` (new requests get 503), waits for those in flight and aborts the rest
(`cli.drain`).

Readiness. The gateway is ready once every one of the deployment's `num_replicas` engine replicas is in its router's
view with a first report (a cache summary) waiting there: the router takes every candidate's report before its first
choice, so no request is routed on a partial view (one replica known, or one whose cache is unknown, splits a
system prompt across replicas). Until then:

    GET /v1/models, GET /health      -> 503 at once, an OpenAI-style error (code "not_ready"), Retry-After: 1
    any other forwarded request      -> waits for readiness, at most `ready_wait_s` (30 s); then the same 503
    GET /metrics, GET /hf_paged/router -> answered (they show the start-up)

Readiness is reached once and kept: a replica Serve replaces later is routed by load until its first report, as
before. With Serve's own router (`router="pow2"`) there is no view to wait for: ready at once. The driver waits for
it (`wait_until_ready`) before it prints the `serving ... on http://` line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from hf_paged.cache.sizing import kv_shape_of
from hf_paged.scaleout.asgi import HttpCall, ResponseStart
from hf_paged.scaleout.drain import DrainGate
from hf_paged.scaleout.metrics_merge import CONTENT_TYPE, ReplicaMetrics, render_scrape
from hf_paged.scaleout.prompt_key import routing_info, template_shared_start
from hf_paged.serving.auth import unauthorized_error
from hf_paged.serving.body import DEFAULT_MAX_REQUEST_BYTES, OFF_LOOP_BYTES, read_body
from hf_paged.serving.errors import ApiError
from hf_paged.serving.prompt_chars import max_prompt_chars

if TYPE_CHECKING:
    from hf_paged.scaleout.spec import ReplicaSpec

__all__ = ["Gateway", "Readiness", "wait_until_ready"]

logger = logging.getLogger("hf_paged.scaleout")

_ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions")
_DEAD = (ActorDiedError, ActorUnavailableError, RayActorError)
_PROBES = ("/v1/models", "/health")  # answered 503 at once before readiness (load balancers, clients' start checks)
RETRY_AFTER_S = 1  # the Retry-After of a not-ready 503: about one routing-stats period


@dataclass(frozen=True, slots=True)
class Readiness:
    """Where the start-up stands: how many engine replicas the router knows and how many have reported."""

    ready: bool
    num_replicas: int  # the deployment's replicas (what readiness waits for)
    num_known: int  # replicas in the router's view
    num_reported: int  # ... with a first report (cache summary) there

    @property
    def message(self) -> str:
        return (f"the server is starting: {self.num_reported} of {self.num_replicas} engine replicas have reported "
                f"their caches to the router ({self.num_known} known); retry in {RETRY_AFTER_S} s")


class Gateway:
    """The HTTP ingress: finds the prompt, forwards the request to the replica the router picks, streams back."""

    scrape_timeout_s = 5.0  # each replica's bound on its `/metrics`; the whole scrape gets 2 s more (Prometheus: 10 s)

    ready_wait_s = 30.0  # how long a request arriving before readiness waits for it (then 503)
    key_check = None  # `--api-key` (`serving.auth.KeyCheck`): checked before anything is routed or tokenized

    def __init__(self, engine: Any, spec: ReplicaSpec, *, num_replicas: int = 1, wait_for_reports: bool = True
                 ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.engine = engine.options(stream=True)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
        if spec.chat_template is not None:
            self.tokenizer.chat_template = spec.chat_template  # the same prompt text as the replicas render
        self.block_size, self.extra_keys = spec.block_size, spec.extra_keys
        self.key_check = spec.api_key
        # What every chat prompt starts with (the template's preamble): the router treats it as no affinity
        self.shared_start = template_shared_start(self.tokenizer)
        self.max_model_len = kv_shape_of(AutoConfig.from_pretrained(spec.model_path)).max_model_len
        self.max_chars = max_prompt_chars(self.tokenizer, self.max_model_len)  # longer texts: routed by load
        self.gate = DrainGate()  # closed by the driver at shutdown (`begin_drain`)
        self.num_replicas, self.wait_for_reports = num_replicas, wait_for_reports
        self._ready = not wait_for_reports  # latched by `readiness()` once every replica has reported
        self.num_rejected: dict[int, int] = {}  # HTTP status -> the gateway's own error answers (not a replica's)

    def readiness(self) -> Readiness:
        """Every replica in the router's view with a first report? Read-only on the router (it runs on its own
        event loop): its replica list and each one's latest routing stats."""
        if self._ready:
            return Readiness(True, self.num_replicas, self.num_replicas, self.num_replicas)
        from hf_paged.scaleout import registry

        known = reported = 0
        target = getattr(self.engine, "deployment_id", None)
        for router in registry.routers():  # the router of this gateway's handle (none before its first update)
            view = router.view_readiness()
            if target is not None and view.deployment_id != target:
                continue  # another deployment's router in this process (prefill replicas under disaggregation)
            known, reported = max(known, view.num_known), max(reported, view.num_reported)
        self._ready = known >= self.num_replicas and reported >= self.num_replicas
        return Readiness(self._ready, self.num_replicas, known, reported)

    async def wait_ready(self, timeout_s: float = 5.0) -> Readiness:
        """The readiness, once ready or after `timeout_s` (the driver calls this until it is ready)."""
        deadline = time.monotonic() + timeout_s
        while not (state := self.readiness()).ready and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return state

    async def __call__(self, request: Request) -> Response:
        if not self.gate.admit():
            return self._counted(_error(503, "the server is shutting down; retry on another server", "shutting_down"))
        try:
            response = await self._answer(request)
        except BaseException:
            self.gate.done()
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self.gate.track(response.body_iterator)
        else:
            self.gate.done()
        return self._counted(response)

    def _counted(self, response: Response) -> Response:
        """Count an error the gateway answered itself (401, 503 not ready / replica lost / draining, a body it
        refused); a replica's answer (it names the replica) is counted by that replica's request_rejected."""
        if response.status_code >= 400 and _REPLICA_HEADER not in response.headers:
            self.num_rejected[response.status_code] = self.num_rejected.get(response.status_code, 0) + 1
        return response

    async def begin_drain(self) -> int:
        """Refuse new requests from now on (HTTP 503); returns the number in flight."""
        return self.gate.close()

    async def num_in_flight(self) -> int:
        return self.gate.num_in_flight

    async def abort_all(self) -> None:
        """Abort every replica's requests; their answers end with the single server's error."""
        for handle in self._engine_handles():
            await handle.broadcast("abort_all").results_async(timeout_s=self.scrape_timeout_s, return_exceptions=True)

    def _engine_handles(self) -> list[Any]:
        """Every deployment of engine replicas (the metrics scrape and the abort reach each)."""
        return [self.engine]

    async def _before_forward(self, call: HttpCall, routing: Any) -> None:
        """Called before a routed request goes to a replica (prefill/decode disaggregation prefills it here)."""

    async def _answer(self, request: Request) -> Response:
        path = request.url.path
        if self.key_check is not None and self.key_check.needed(path) and not self.key_check.authorized(
                request.headers.raw):
            return JSONResponse(unauthorized_error().body(), status_code=401, headers={"www-authenticate": "Bearer"})
        if path == "/hf_paged/router" and request.method == "GET":
            from hf_paged.scaleout import registry

            return JSONResponse([router.snapshot() for router in registry.routers()])
        if path == "/metrics" and request.method == "GET":
            return Response(await self.scrape(), media_type=CONTENT_TYPE)
        if not self._ready:
            state = self.readiness() if path in _PROBES else await self.wait_ready(self.ready_wait_s)
            if not state.ready:
                return _error(503, state.message, "not_ready", retry_after_s=RETRY_AFTER_S)
        try:  # the replicas' own limit, applied before a byte is forwarded
            body = await read_body(request, DEFAULT_MAX_REQUEST_BYTES)
        except ApiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        call = HttpCall(request.method, path, request.url.query.encode(), tuple(request.headers.raw), body)
        routing = None
        if request.method == "POST" and path in _ROUTED_PATHS:
            find = (path, body, self.tokenizer, self.block_size, self.extra_keys, self.shared_start,
                    self.max_model_len, self.max_chars)
            # a big body is read and tokenized beside the event loop: the streams it carries keep flowing
            routing = await run_in_threadpool(routing_info, *find) if len(body) > OFF_LOOP_BYTES else \
                routing_info(*find)
            await self._before_forward(call, routing)
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

        results: list[ReplicaMetrics | BaseException] = []
        for handle in self._engine_handles():
            try:
                response = handle.broadcast("metrics", timeout_s=self.scrape_timeout_s)
                results += await response.results_async(timeout_s=self.scrape_timeout_s + 2.0, return_exceptions=True)
            except Exception as exc:  # noqa: BLE001 -- no replica running, or one stuck past its own bound
                logger.warning("metrics scrape failed as a whole: %r", exc)
                results.append(exc)
        routers = registry.routers()
        routed = None
        if routers:  # the cache-aware router (Serve's own pow2 router keeps no such counts)
            routed = {}
            for router in routers:
                for reason, n in router.snapshot()["routed"].items():
                    routed[reason] = routed.get(reason, 0) + n
        return render_scrape(results, routed=routed, rejected=self.num_rejected)


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


_REPLICA_HEADER = "x-hf-paged-replica"  # on every answer a replica gave (`EngineReplica.forward`)


def _error(status: int, message: str, code: str, *, retry_after_s: int | None = None) -> Response:
    """An answer of the gateway's own, shaped as a replica's (`ApiError`: the type its status gets there too)."""
    headers = None if retry_after_s is None else {"retry-after": str(retry_after_s)}
    return JSONResponse(ApiError(message, status=status, code=code).body(), status_code=status, headers=headers)


def wait_until_ready(handle: Any, timeout_s: float) -> Readiness:
    """Driver side: ask the gateway (its Serve app `handle`) until it is ready or `timeout_s` passed; the last
    `Readiness` either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        state = handle.options(method_name="wait_ready").remote(max(0.0, min(5.0, left))).result(timeout_s=60)
        if state.ready or left <= 0:
            return state
