"""Connections that send no complete request head in time, or stop reading a response, are closed.

uvicorn closes an idle keep-alive connection after `--timeout-keep-alive`, but a connection that trickles a
request's headers a few bytes at a time (any byte cancels that timer) is held for as long as the client likes: 200
such connections stayed open for as long as h63 fed them, and enough of them take every file descriptor, after
which nobody else connects. Here each connection must start a new request (its head complete) within
`header_timeout_s` of being opened or of its previous response ending, or it is closed; a request in progress (a
long stream, a slow upload of its body) is never cut.

A client that stops reading a response but keeps its socket open (a stalled stream reader) fills the socket buffers,
then the transport's; uvicorn then pauses the handler at its next write, and has no write timeout, so the handler
waited forever: its engine requests ran on to `max_tokens` into a buffer nobody reads, and the connection, the
handler and every undelivered event stayed in memory until the client went away. Here a connection whose writes stay
paused for `send_timeout_s` (nginx's `send_timeout`, 60 s by default: time between two successful writes) is
aborted: uvicorn reports the disconnect, and the handler aborts the response's engine requests, as for a client that
closed. A slow reader that keeps reading is never cut.
"""

from __future__ import annotations

import asyncio

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "DEFAULT_SEND_TIMEOUT_S", "header_deadline_protocol"]

DEFAULT_HEADER_TIMEOUT_S = 30.0  # nginx's client_header_timeout is 60 s; a real client sends its head at once
DEFAULT_SEND_TIMEOUT_S = 60.0  # nginx's send_timeout: a client that reads nothing for this long is gone


def header_deadline_protocol(header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, http: str = "auto", *,
                             send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> type:
    """uvicorn's HTTP protocol class (`http`: "auto", "httptools" or "h11", as uvicorn's `--http`) with a deadline on
    request heads and one on stalled writes (`send_timeout_s`); pass it as `uvicorn.Config(http=...)`."""
    for name, value in (("header_timeout_s", header_timeout_s), ("send_timeout_s", send_timeout_s)):
        if not 0 < value < float("inf"):
            raise ValueError(f"{name} must be a number of seconds > 0, got {value}")
    base = _protocol_class(http)

    class HeaderDeadlineProtocol(base):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None
        _seen_cycle: object = None  # the request cycle current when the deadline was armed
        _stall: asyncio.TimerHandle | None = None  # armed while the transport has paused our writes

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            for timer in (self._deadline, self._stall):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            """The client is not reading what we send (its socket and our write buffer are full): abort the
            connection unless writing resumes within `send_timeout_s`."""
            super().pause_writing()
            if self._stall is None:
                self._stall = self.loop.call_later(send_timeout_s, self._stalled)

        def resume_writing(self) -> None:
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            super().resume_writing()

        def _stalled(self) -> None:
            # abort, not close: close() (also uvicorn's, after a response) waits to flush a buffer nobody reads
            self._stall = None
            self.transport.abort()

        def _arm(self) -> None:
            self._seen_cycle = self.cycle
            self._deadline = self.loop.call_later(header_timeout_s, self._check)

        def _check(self) -> None:
            """Close the connection unless a request started since the deadline was armed or one is in progress."""
            cycle = self.cycle
            started = cycle is not self._seen_cycle
            in_progress = cycle is not None and not cycle.response_complete
            if started or in_progress:
                self._arm()
            elif not self.transport.is_closing():
                self.transport.close()

    HeaderDeadlineProtocol.__name__ = HeaderDeadlineProtocol.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadlineProtocol


def _protocol_class(http: str) -> type:
    if http in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

            return HttpToolsProtocol
        except ImportError:
            if http == "httptools":
                raise
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol
