"""The HTTP layer: OpenAI's endpoints over one `EngineLoop`. It translates requests and errors, nothing more:
scheduling, batching and cancellation live in the engine loop.

    POST /v1/completions, /v1/chat/completions   (stream: server-sent events ending with `data: [DONE]`)
    POST /tokenize                                (vLLM's: a text's token ids under this server's tokenizer)
    GET  /v1/models, /v1/models/{id}, /health (?detail=1), /metrics

Every error is an OpenAI error body with a 4xx (the client's fault: the field is named) or a 5xx without a
traceback (ours: logged here). A client that goes away, streaming or not, has its requests aborted at once.
With `ServerSettings.api_key`, every route but /health and /metrics needs `Authorization: Bearer <key>` (`auth.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from hf_paged.batching.engine import Engine
from hf_paged.batching.engine_loop import LoopClosedError
from hf_paged.serving.admission import MAX_BIG_BODIES_DECODING, AdmissionGate, waiting_bound
from hf_paged.serving.auth import ApiKeyAuth
from hf_paged.serving.body import DEFAULT_MAX_REQUEST_BYTES, OFF_LOOP_BYTES, decode_request, read_body
from hf_paged.serving.defaults import request_defaults
from hf_paged.serving.echo import (
    EchoPrefix,
    EchoStream,
    echo_choices,
    echo_prefixes,
    echo_scored,
    prepare_echo,
    run_echo,
    with_prefix,
)
from hf_paged.serving.envelope import Head
from hf_paged.serving.errors import ApiError
from hf_paged.serving.generation import ChoiceEvent, Usage, run_choices
from hf_paged.serving.logprobs import TokenPieces
from hf_paged.serving.metrics import ServerMetrics
from hf_paged.serving.prepare import DEFAULT_MAX_STOP_SEQUENCES, PreparedRequest, Preparer
from hf_paged.serving.protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from hf_paged.serving.retention import PrefixRetention

logger = logging.getLogger("hf_paged.serving")

__all__ = ["ServerSettings", "build_app"]


@dataclass(slots=True)
class ServerSettings:
    model_name: str = "hf-paged"
    max_waiting: int | None = None  # most sequences queued before new requests get 429; None: DEFAULT_WAITING_BATCHES
    #   x the engine's max_num_seqs; 0: no bound
    retry_after_s: int = 1  # the Retry-After of a 429
    max_cache_retention_s: float = 3600.0  # the longest cache_retention_seconds a request may ask (0: refused)
    max_stop_sequences: int = DEFAULT_MAX_STOP_SEQUENCES  # most `stop` strings a request may send (0: no bound)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a longer body gets 413 (read no further)
    generation_config: str = "auto"  # omitted sampling fields: "auto" the model's generation_config, "vllm" OpenAI's
    #   defaults, or a directory with a generation_config.json (`defaults.py`)
    api_key: str | None = None  # requests but /health and /metrics need `Authorization: Bearer <key>` (`auth.py`)


class _AppState:
    """What the routes share: the engine loop, the tokenizer, the preparer and the metrics."""

    def __init__(self, engine: Engine, tokenizer: Any, settings: ServerSettings) -> None:
        self.engine = engine
        self.loop = engine.loop
        self.tokenizer = tokenizer
        self.settings = settings
        self.preparer = Preparer(engine, tokenizer, settings.max_cache_retention_s,
                                 request_defaults(engine.model, settings.generation_config),
                                 max_stop_sequences=settings.max_stop_sequences)
        self.pieces = TokenPieces(tokenizer)  # token texts and bytes for `logprobs` answers (memoised per id)
        self.metrics = ServerMetrics(self.loop, settings.model_name)
        self.retention = self.metrics.retention = PrefixRetention(engine)  # cache_retention_seconds' pins
        self.background: set[asyncio.Task] = set()  # fire-and-forget tasks (pins)
        self.gate = AdmissionGate(self.loop, waiting_bound(settings.max_waiting, engine.config.max_num_seqs),
                                  settings.retry_after_s)  # --max-waiting
        self.big_bodies = asyncio.Semaphore(MAX_BIG_BODIES_DECODING)  # big bodies decoded at once

    async def parse(self, request: Request, model: type) -> Any:
        raw = await read_body(request, self.settings.max_request_bytes)
        if len(raw) > OFF_LOOP_BYTES:  # a big body is decoded beside the event loop: streams keep flowing
            async with self.big_bodies:  # a few at a time: memory and CPU stay bounded under a flood of them
                return await run_in_threadpool(decode_request, raw, model, self.settings.model_name)
        return decode_request(raw, model, self.settings.model_name)

    @property
    def num_admitted(self) -> int:
        return self.gate.num_admitted


class _ClosingStream(StreamingResponse):
    """A streamed response that runs `on_close` however it ends, also when the client left before its body
    started (Starlette then never iterates the body, so a `finally` in the body would not run)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def build_app(engine: Engine, tokenizer: Any, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app over `engine` (its loop starts with the app and stops, aborting what runs, at shutdown)."""
    server = _AppState(engine, tokenizer, settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.loop.start()
        yield
        server.retention.close()
        await run_in_threadpool(server.loop.shutdown)

    app = FastAPI(title="hf-paged serve", lifespan=lifespan)
    app.state.server = server
    _error_handlers(app, server)
    if server.settings.api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=server.settings.api_key, on_rejected=server.metrics.observe_rejected)

    @app.get("/health")
    async def health(detail: str = "") -> Response:
        status = 200 if server.loop.is_alive else 503
        if detail.strip().lower() in ("", "0", "false", "no", "off"):  # (?detail=1, =true, =yes: the details)
            return Response(status_code=status)
        return JSONResponse(await run_in_threadpool(server.metrics.health), status_code=status)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await run_in_threadpool(server.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card() -> dict:
        return {"id": server.settings.model_name, "object": "model", "created": 0, "owned_by": "hf_paged",
                "max_model_len": engine.max_model_len, "block_size": engine.config.block_size,  # ours: for clients
                "eos_token_ids": server.preparer.eos_token_ids}  # that tokenize

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")  # OpenAI's retrieve; a model id may hold "/" ("hf-paged/tiny-lm")
    async def model(model_id: str) -> dict:
        if model_id != server.settings.model_name:
            raise ApiError(f"the model {model_id!r} does not exist; this server serves {server.settings.model_name!r}",
                           status=404, param="model", code="model_not_found")
        return model_card()

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:  # vLLM's: what this server's tokenizer makes of a text
        body = await server.parse(request, TokenizeRequest)
        # (a text longer than any of max_model_len tokens can be is refused untokenized: 10 MB took 17 s and 640 MB)
        ids = await run_in_threadpool(
            lambda: list(server.preparer.tokenize(body.prompt, "prompt", add_special_tokens=body.add_special_tokens)))
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        received = time.perf_counter()
        body = await server.parse(request, CompletionRequest)
        server.gate.check_size(len(body.prompts()), body.n)  # before tokenizing them all
        if body.echo and body.max_tokens == 0:  # scoring: the prompt's log-probabilities, nothing generated
            return await _echo(server, request, body, received)
        return await _answer(server, request, body, server.preparer.completion, "text_completion", received)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        received = time.perf_counter()
        body = await server.parse(request, ChatCompletionRequest)
        return await _answer(server, request, body, server.preparer.chat, "chat.completion", received)

    return app


async def _answer(server: _AppState, request: Request, body, prepare: Callable[[Any], PreparedRequest], kind: str,
                  received: float) -> Response:
    prepared = await run_in_threadpool(prepare, body)  # may compile a schema: off the event loop; 400s first
    scored = echo_scored(prepared.prompts, prepared.params.logprobs) if getattr(body, "echo", False) else []
    admission = server.gate.admit(len(prepared.prompts), prepared.params.num_return_sequences, len(scored))
    try:
        head = Head(kind, body.model or server.settings.model_name, body.return_token_ids,
                    server.pieces if prepared.params.logprobs is not None else None)
        usage = Usage()
        events = run_choices(server.loop, prepared, server.tokenizer, server.metrics, usage, received,
                             on_queued=admission.queued, on_prefilled=_retainer(server, prepared))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        echo = None  # completions' echo with generation: the prompts (and their entries) before the choices
        if getattr(body, "echo", False):
            echo = functools.partial(echo_prefixes, server.loop, prepared.prompts, prepared.echo_texts,
                                     server.pieces, prepared.params.logprobs, admission.scoring_queued)
        if body.stream:
            stream = EchoStream(echo, prepared.params.num_return_sequences) if echo is not None else None
            response = _ClosingStream(_sse(head, events, usage, include_usage, stream), admission.close,
                                      media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            admission = None  # the response closes it
            return response
        result = await _until_disconnect(request, _collect(head, events, usage, prepared,
                                                           echo() if echo is not None else None))
    finally:
        if admission is not None:
            admission.close()
    if result is None:
        return Response(status_code=499)  # the client is gone: nobody reads this
    return JSONResponse(result)


async def _echo(server: _AppState, request: Request, body: CompletionRequest, received: float) -> Response:
    """Scoring (`echo.py`): the prompts' log-probabilities in one answer, aborted if the client leaves."""
    echo = await run_in_threadpool(prepare_echo, server.engine, server.tokenizer, body, server.preparer.tokenize)
    admission = server.gate.admit(len(echo.prompts))
    try:
        outputs = await _until_disconnect(request, run_echo(server.loop, echo, admission.queued))
    except LoopClosedError:
        raise ApiError("the server is shutting down; retry", status=503, code="shutting_down") from None
    finally:
        admission.close()
    if outputs is None:
        return Response(status_code=499)  # the client is gone: nobody reads this
    usage = Usage()
    choices = echo_choices(echo, outputs, server.tokenizer, usage, return_token_ids=body.return_token_ids)
    for output in outputs:  # each choice ends "length": a success, as a generated choice is (lm-eval's traffic)
        server.metrics.observe_finished("length", time.perf_counter() - received, output)
    head = Head("text_completion", body.model or server.settings.model_name)
    return JSONResponse(head.envelope(choices, usage.as_dict()))


def _retainer(server: _AppState, prepared: PreparedRequest) -> Callable[[int], None] | None:
    """What pins prompt i's prefix once it is computed, for a request with `cache_retention_seconds`."""
    if prepared.retention is None:
        return None
    tokens, seconds = prepared.retention

    def retain(i: int) -> None:
        prompt = prepared.prompts[i]
        task = asyncio.create_task(server.retention.hold(prompt[:tokens], seconds))
        server.background.add(task)  # a reference until it ends (the loop keeps only weak ones)
        task.add_done_callback(server.background.discard)

    return retain


async def _collect(head: Head, events: AsyncIterator[ChoiceEvent], usage: Usage, prepared: PreparedRequest,
                   echo: Awaitable[list[EchoPrefix]] | None = None) -> dict:
    texts: dict[int, list[str]] = {}
    ids: dict[int, list[int]] = {}
    entries: dict[int, list] = {}  # choice -> its log-probability entries (when asked)
    finals: dict[int, ChoiceEvent] = {}
    prefixes = asyncio.ensure_future(echo) if echo is not None else None  # runs beside the generation
    try:
        async with _closing(events):
            async for event in events:
                texts.setdefault(event.index, []).append(event.text)
                ids.setdefault(event.index, []).extend(event.token_ids or [])
                entries.setdefault(event.index, []).extend(event.logprobs or [])
                if event.finish_reason is not None:
                    finals[event.index] = event
        echoed = await prefixes if prefixes is not None else None
    except LoopClosedError:
        raise ApiError("the server is shutting down; retry", status=503, code="shutting_down") from None
    finally:
        if prefixes is not None and not prefixes.done():
            prefixes.cancel()  # aborts its scoring requests
            await asyncio.gather(prefixes, return_exceptions=True)
    failed = [e for e in finals.values() if e.finish_reason in ("error", "abort")]
    if failed:
        if failed[0].finish_reason == "abort":
            raise ApiError("the server shut down before the request finished; retry", status=503,
                           code="shutting_down")
        status, code = failed[0].error_status()
        raise ApiError(f"the request failed: {failed[0].error}", status=status, code=code)
    choices = []
    for index in sorted(finals):
        event = finals[index]
        whole = ChoiceEvent(index, "".join(texts[index]), event.finish_reason, token_ids=ids[index],
                            prompt_token_ids=event.prompt_token_ids, finish_detail=event.finish_detail,
                            logprobs=entries[index] if prepared.params.logprobs is not None else None)
        if echoed is not None:
            whole = with_prefix(whole, echoed[index // prepared.params.num_return_sequences])
        choices.append(head.choice(whole, chunk=False))
    return head.envelope(choices, usage.as_dict())


async def _sse(head: Head, events: AsyncIterator[ChoiceEvent], usage: Usage, include_usage: bool,
               echo: EchoStream | None = None):
    """Server-sent events in OpenAI's chunk format. A failed choice sends an error event; the stream still ends
    with `data: [DONE]`. `echo`: each choice's first chunk starts with its prompt (`echo.py`)."""
    started: set[int] = set()
    try:
        async with _closing(events), (echo if echo is not None else contextlib.nullcontext()):
            async for event in events:
                if event.finish_reason == "error":
                    yield _error_event(f"the request failed: {event.error}", *event.error_status())
                    continue
                if event.finish_reason == "abort":  # only the server aborts (a client that left reads nothing)
                    yield _error_event("the server shut down before the request finished; retry", 503,
                                       "shutting_down")
                    continue
                first = event.index not in started
                started.add(event.index)
                if echo is not None:
                    event = await echo.apply(event, first)
                chunk = head.envelope([head.choice(event, chunk=True, first=first)], chunk=True)
                if include_usage:
                    chunk["usage"] = None
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except LoopClosedError:
        yield _error_event("the server shut down before the request finished; retry", 503, "shutting_down")
    except ApiError as exc:  # echo's scoring of a prompt failed
        yield _error_event(exc.message, exc.status, exc.code or "request_failed")
    except Exception as exc:
        logger.exception("stream failed")
        yield _error_event(f"internal error ({type(exc).__name__}); the server log has the details")
    if include_usage:
        yield f"data: {json.dumps(head.envelope([], usage.as_dict(), chunk=True))}\n\n"
    yield "data: [DONE]\n\n"


def _error_event(message: str, status: int = 500, code: str = "request_failed") -> str:
    return f"data: {json.dumps(ApiError(message, status=status, code=code).body())}\n\n"


@asynccontextmanager
async def _closing(events: AsyncIterator):
    try:
        yield events
    finally:
        await events.aclose()  # aborts the requests still running (client gone, task cancelled)


async def _until_disconnect(request: Request, work: Awaitable[dict]) -> dict | None:
    """Run `work` unless the client disconnects first: then cancel it (which aborts its requests)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


def _error_handlers(app: FastAPI, server: _AppState) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        server.metrics.observe_rejected(exc.status)
        if exc.status >= 500:
            logger.error("%s %s: %s", request.method, request.url.path, exc.message)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = ApiError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code,
                         code=str(exc.status_code))
        return await api_error(request, error)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        error = ApiError(f"internal error ({type(exc).__name__}); the server log has the details", status=500,
                         code="internal_error")
        return JSONResponse(error.body(), status_code=500)
