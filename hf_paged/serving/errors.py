"""Errors the server answers with, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "error_body"]


class ApiError(Exception):
    """An HTTP error answer: status, message (names the problem and the fix), type, the field at fault, a code."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
        type: str | None = None, headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _DEFAULT_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


_DEFAULT_TYPES = {404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable_error"}


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
