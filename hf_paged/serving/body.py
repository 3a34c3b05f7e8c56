"""A request body -> the validated request model, or an `ApiError` naming what is wrong.

A body is read up to `ServerSettings.max_request_bytes` (413 past it, from the declared length before anything is
read, else as soon as the count passes it), and only as JSON: a `Content-Type` other than JSON gets 415 (a web page
can send `text/plain` or a form to a server on localhost without the browser asking first; no header is taken as
JSON, as FastAPI does) and uncompressed (a `Content-Encoding` such as gzip gets 415: it is not inflated, so a small
body cannot become a large one). Decoding and validating run on the event loop for small bodies and in a
worker thread past `OFF_LOOP_BYTES`: a 12 MB list of token ids took 3.8 s to decode and validate, during which every
stream the server was sending stalled.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from hf_paged.serving.errors import ApiError, validation_message
from hf_paged.serving.protocol import UnsupportedField

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "OFF_LOOP_BYTES", "decode_request", "read_body"]

DEFAULT_MAX_REQUEST_BYTES = 32 * 2**20  # 32 MiB: a full context as text or ids, a batch of prompts, big schemas
OFF_LOOP_BYTES = 256 * 2**10  # ~1 ms of decoding: smaller bodies stay on the event loop (no thread hop)


def _too_large(size: int, limit: int, declared: bool) -> ApiError:
    said = "declares" if declared else "has more than"
    return ApiError(f"the request body {said} {size:,} bytes; this server takes at most {limit:,} "
                    "(--max-request-bytes): send a shorter prompt or fewer prompts per request",
                    status=413, code="request_too_large")


def _check_media_type(value: str, encoding: str) -> None:
    media = value.split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise ApiError(f"the request's Content-Type is {media!r}; this server reads JSON bodies only: send "
                       "'Content-Type: application/json' (curl: -H 'Content-Type: application/json' or --json)",
                       status=415, code="unsupported_media_type")
    coding = encoding.strip().lower()
    if coding not in ("", "identity"):  # read as JSON it was 'not valid JSON (... byte 0x8b ...)': say why
        raise ApiError(f"the request's Content-Encoding is {coding!r}; this server reads uncompressed bodies only: "
                       "send the JSON as it is, without Content-Encoding", status=415, code="unsupported_media_type")


async def read_body(request: Request, limit: int) -> bytes:
    _check_media_type(request.headers.get("content-type", ""), request.headers.get("content-encoding", ""))
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit, declared=True)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit, limit, declared=False)
        chunks.append(chunk)
    return b"".join(chunks)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # JSON's escape of half a surrogate pair


def decode_request(raw: bytes, model: type, model_name: str) -> Any:
    """The body as `model` (a pydantic request class), checked for fields this server refuses and for its model."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON ({exc}); send a JSON object", code="invalid_json") from None
    except RecursionError:  # the decoder recurses once per level: ~1,000 nested arrays/objects
        raise ApiError("the request body nests too deeply to parse (about 1,000 levels of arrays or objects); "
                       "send a flatter JSON object", code="invalid_json") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300): a 500 before
        raise ApiError(f"the request body holds a number too long to read ({exc}); send numbers of at most "
                       f"{sys.get_int_max_str_digits():,} digits", code="invalid_json") from None
    if _SURROGATE_ESCAPE.search(raw):  # (a pair escapes one astral character: fine; a lone half is no text)
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError("the request body holds a lone UTF-16 surrogate escape (such as \\ud800) in a string, "
                           "which is no Unicode text; send text as UTF-8, or an astral character as a surrogate "
                           "pair", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        body = model.model_validate(data)
        body.check_supported()
    except ValidationError as exc:
        param, message = validation_message(exc.errors())
        raise ApiError(f"{param}: {message}" if param else message, param=param, code="invalid_value") from None
    except UnsupportedField as exc:
        raise ApiError(str(exc), param=exc.param, code="unsupported_parameter") from None
    if body.model is not None and body.model != model_name:
        raise ApiError(f"the model {body.model!r} does not exist here; this server serves {model_name!r} "
                       "(GET /v1/models)", status=404, param="model", code="model_not_found")
    return body
