"""Connections that send no complete request head in time are closed (slowloris).

uvicorn closes an idle keep-alive connection after `--timeout-keep-alive`, but a connection that trickles a
request's headers a few bytes at a time (any byte cancels that timer) is held for as long as the client likes: 200
such connections stayed open for as long as h63 fed them, and enough of them take every file descriptor, after
which nobody else connects. Here each connection must start a new request (its head complete) within
`header_timeout_s` of being opened or of its previous response ending, or it is closed; a request in progress (a
long stream, a slow upload of its body) is never cut.
"""

from __future__ import annotations

import asyncio

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "header_deadline_protocol"]

DEFAULT_HEADER_TIMEOUT_S = 30.0  # nginx's client_header_timeout is 60 s; a real client sends its head at once


def header_deadline_protocol(header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, http: str = "auto") -> type:
    """uvicorn's HTTP protocol class (`http`: "auto", "httptools" or "h11", as uvicorn's `--http`) with a deadline on
    request heads; pass it as `uvicorn.Config(http=...)`."""
    if header_timeout_s <= 0:
        raise ValueError(f"header_timeout_s must be > 0 seconds, got {header_timeout_s}")
    base = _protocol_class(http)

    class HeaderDeadlineProtocol(base):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None
        _seen_cycle: object = None  # the request cycle current when the deadline was armed

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

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
