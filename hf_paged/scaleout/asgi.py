"""Call an ASGI app in-process and stream its response: how an engine replica serves the existing FastAPI app
(`hf_paged.serving.build_app`) to requests that arrive as Ray handle calls.

    forward(app, HttpCall) -> ResponseStart(status, headers), then body chunks (bytes), in order

Closing the generator early (the client went away) makes the app's `receive()` answer `http.disconnect`, which the
app turns into aborting the engine requests; a task still running a second later is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HttpCall", "ResponseStart", "forward"]

_GRACE_S = 1.0  # how long a left client's request may take to wind down before its task is cancelled


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One HTTP request, as plain data (it crosses processes pickled)."""

    method: str
    path: str
    query_string: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class ResponseStart:
    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


async def forward(app: Any, call: HttpCall) -> AsyncIterator[ResponseStart | bytes]:
    """Run `call` through the ASGI `app`; yield the response start, then each non-empty body chunk."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": call.method, "scheme": "http", "path": call.path, "raw_path": call.path.encode(),
        "query_string": call.query_string, "root_path": "", "headers": list(call.headers),
        "client": ("127.0.0.1", 0), "server": ("hf_paged-replica", 0),
    }
    messages: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await messages.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await messages.put(None)  # the app returned (or failed): no more messages

    task = asyncio.ensure_future(run())
    complete = False
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                yield ResponseStart(message["status"], list(message.get("headers", [])))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    complete = True
                    break
        if not complete:
            await task  # re-raises what the app raised
            raise RuntimeError(f"{call.method} {call.path}: the app returned without completing a response")
    finally:
        gone.set()
        if not task.done():  # the client left: the app sees the disconnect and aborts its engine requests
            await asyncio.wait({task}, timeout=_GRACE_S)
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
