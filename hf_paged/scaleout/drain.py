"""The gateway's door at shutdown: counts the requests in flight and, once closed, turns new ones away.

A request is in flight from its arrival until its answer's last chunk is sent (a streamed answer counts until its
stream ends, or the client goes away). The driver closes the door on SIGTERM, waits for the count to reach zero for
`--shutdown-timeout` seconds, then aborts what is left (`cli.py`). Pure: no Ray; the gateway's event loop is its
only caller, so no lock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

__all__ = ["DrainGate"]


class DrainGate:
    """`admit()` before a request, `done()` after it (or `track(body)` for a streamed one); `close()` at shutdown."""

    def __init__(self) -> None:
        self.num_in_flight = 0  # admitted and not done
        self.is_closed = False  # True from close() on: admit() refuses

    def admit(self) -> bool:
        """Count a new request in; False (and nothing counted) once the gate is closed."""
        if self.is_closed:
            return False
        self.num_in_flight += 1
        return True

    def done(self) -> None:
        if self.num_in_flight <= 0:
            raise RuntimeError("DrainGate.done() without a matching admit()")
        self.num_in_flight -= 1

    def close(self) -> int:
        """Refuse every request from now on; returns the number still in flight."""
        self.is_closed = True
        return self.num_in_flight

    async def track(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`body`, chunk by chunk; the request is done when it ends, fails or is closed (a client gone)."""
        try:
            async for chunk in body:
                yield chunk
        finally:
            self.done()
