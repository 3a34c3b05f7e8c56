"""A Ray Serve deployment handle without Ray, for the gateway's own tests: every forwarded call gets the answer a
test chooses, as the stream of parts a replica's `forward` yields."""

from __future__ import annotations

from collections.abc import Callable

from hf_paged.scaleout.asgi import ResponseStart


class ReplicaAnswer:
    """What `forward` streams back: a JSON response of `status` with `headers`, body `{}`."""

    def __init__(self, status: int, headers: tuple = ()) -> None:
        self.items = [ResponseStart(status, [(b"content-type", b"application/json"), *headers]), b"{}"]

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)


class FakeHandle:
    """`handle.options(...).forward.remote(call, routing)` answers `respond(call)`; `broadcast` has no replica."""

    def __init__(self, respond: Callable[[object], ReplicaAnswer]) -> None:
        self.respond = respond

    def options(self, **_):
        return self

    @property
    def forward(self):
        return self

    def remote(self, call, routing=None):
        return self.respond(call)

    def broadcast(self, method, **kwargs):
        raise RuntimeError("no replica in this test")
