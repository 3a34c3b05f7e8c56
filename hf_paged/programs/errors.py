"""Typed errors of structured programs and templates. Each names the field or hole, the problem and the fix."""

from __future__ import annotations

from hf_paged.errors import HfPagedError

__all__ = [
    "FieldConstraintError",
    "ProgramAbortedError",
    "ProgramError",
    "ServerRequestError",
    "ServerTimeoutError",
    "ServerUnavailableError",
    "TemplateError",
    "ValidatorError",
]


class ProgramError(HfPagedError, RuntimeError):
    """A program's call failed in the engine (its request ended FAILED); the message names the field."""


class ProgramAbortedError(ProgramError):
    """A call was cut off because its program raised or was aborted (its requests were aborted, blocks freed)."""


class TemplateError(HfPagedError, ValueError):
    """A `fill` template cannot be compiled: an unbalanced hole, a hole without a constraint, a duplicate name, a
    constraint for a hole the template does not have, or a constraint the chosen mode cannot combine."""


class FieldConstraintError(HfPagedError, TypeError, ValueError):
    """A field's constraint (`gen(regex=, schema=, choices=, grammar=)`, a `fill` hole's value) is malformed: the
    wrong type, several at once, an empty choice list, a bad length."""


class ValidatorError(HfPagedError, RuntimeError):
    """A field's `validator` raised instead of returning True/False; the original exception is the `__cause__`."""


class ServerUnavailableError(ProgramError, ConnectionError):
    """`hp.remote(url)`: the server cannot be reached (connection refused or reset, no such host); the message
    names the URL."""


class ServerTimeoutError(ProgramError, TimeoutError):
    """`hp.remote(url, timeout=)`: a request got no answer within the timeout (its connection is closed, so the
    server aborts it)."""


class ServerRequestError(ProgramError):
    """`hp.remote(url)`: the server answered an error (a 4xx: the request was refused; a 5xx: it failed there). The
    message quotes the server's; `status`, `code` and `param` are its OpenAI error fields."""

    def __init__(self, message: str, *, status: int, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
