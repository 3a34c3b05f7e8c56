"""`--api-key`: every request but `/health` and `/metrics` must carry `Authorization: Bearer <key>`.

A plain ASGI middleware in front of the app (vLLM's `--api-key` does the same): a request without the key, or with
another one, gets 401 with an OpenAI error body (`code: "invalid_api_key"`) and `WWW-Authenticate: Bearer`, before
its body is read or anything runs. The key is compared as a SHA-256 digest with `hmac.compare_digest`, so the time
taken says nothing about how much of a guess was right, nor about the key's length. `/health` and `/metrics` stay
open: load balancers and Prometheus scrape them without credentials (they say nothing a request could not).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hf_paged.serving.errors import ApiError

__all__ = ["API_KEY_ENV", "OPEN_PATHS", "ApiKeyAuth", "KeyCheck", "unauthorized_error"]

API_KEY_ENV = "HF_PAGED_API_KEY"  # the key from the environment: kept out of `ps` and shell history
OPEN_PATHS = frozenset({"/health", "/metrics"})


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """The key's SHA-256 digest and the check of a request's headers against it. Plain data: `--replicas` hands it
    to the gateway replica (pickled through Ray), so the key itself is never stored in the cluster's state."""

    digest: bytes

    @classmethod
    def from_key(cls, api_key: str) -> KeyCheck:
        if not api_key:
            raise ValueError("api_key is empty: give the key clients must send, or serve without one")
        return cls(_digest(api_key.encode()))

    def needed(self, path: str) -> bool:
        """Whether a request to `path` must carry the key (every path but `OPEN_PATHS`)."""
        return path not in OPEN_PATHS

    def authorized(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the request's `Authorization` header is `Bearer <the key>` (scheme case-insensitive)."""
        values = [v for k, v in headers if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), self.digest)


def unauthorized_error() -> ApiError:
    """The 401 a request without the key gets (its response also carries `WWW-Authenticate: Bearer`)."""
    return ApiError("missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key this "
                    "server was started with (--api-key or HF_PAGED_API_KEY)", status=401, code="invalid_api_key")


class ApiKeyAuth:
    """ASGI middleware: HTTP requests to any path but `OPEN_PATHS` need `Authorization: Bearer <api_key>`."""

    def __init__(self, app: Any, api_key: str, on_rejected: Any = None) -> None:
        self.app = app
        self.check = KeyCheck.from_key(api_key)
        self._on_rejected = on_rejected  # called with the status of each refused request (metrics)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.check.needed(scope["path"]) or self.check.authorized(scope["headers"]):
            await self.app(scope, receive, send)
            return
        if self._on_rejected is not None:
            self._on_rejected(401)
        body = json.dumps(unauthorized_error().body()).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
