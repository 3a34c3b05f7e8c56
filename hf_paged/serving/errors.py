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


_KINDS = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "a boolean",
          "list_type": "a list", "dict_type": "an object", "model_type": "an object", "none_required": "null"}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str | None, str]:
    """(the top-level field, as vLLM names it; what is wrong with it) from pydantic's errors. A value refused by
    every branch of a union on its type reads as one message naming what it should be ("a number", not pydantic's
    first branch "a valid integer")."""
    loc = errors[0]["loc"]
    param = str(loc[0]) if loc else None
    same = [e for e in errors if e["loc"][:1] == loc[:1]]
    paths = [_path(e["loc"]) for e in same]
    # a union branch that took the value and found a part of it wrong (a list of strings with a number in it):
    # that part, not the other branches' "should be a string"
    deep = [(e, p) for e, p in zip(same, paths) if len(p) > len(min(paths, key=len))]
    if len(same) > 1 and deep:
        return param, f"{deep[0][1]}: {deep[0][0]['msg']}"
    if len(same) > 1 and all(e["type"] in _KINDS for e in same):
        kinds = list(dict.fromkeys(_KINDS[e["type"]] for e in same))
        if "a number" in kinds and "an integer" in kinds:
            kinds.remove("an integer")
        value, where = same[0].get("input"), paths[0]
        where = f"{where}: " if where != param else ""
        return param, f"{where}Input should be {' or '.join(kinds)}, got {type(value).__name__} {value!r}"[:300]
    if paths[0] != param:  # inside a list or object: say where (messages[2].content: ...)
        return param, f"{paths[0]}: {same[0]['msg']}"
    return param, same[0]["msg"]


def _path(loc: tuple) -> str:
    """pydantic's location as a client wrote it, without the union branches' names: messages[0].content[1].type."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" not in part and part not in _BRANCHES:
            out += f".{part}" if out else part
    return out


_BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none", "text", "texts", "ids", "id_lists"}  # (and tags)
