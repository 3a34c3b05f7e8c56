"""The HTTP backend: the same programs against a running `hf-paged serve` (`HTTPBackend`).

    server = hp.remote("http://127.0.0.1:8000", timeout=120)       # where, and how long one request may take
    state = triage.run(server, tokenizer, ticket="...")             # tokenizer: the served model's own
    filled = hp.fill(server, tokenizer, prompt, template, ...)

Text is tokenized here, as in process, and every call sends token ids, so the server computes exactly the tokens
an in-process run computes:

    gen      POST /v1/completions {prompt: [ids], max_tokens, temperature (0: greedy), top_p, seed, stop,
             guided_regex | guided_json | guided_grammar, return_token_ids: true}
             -> choices[0].token_ids (as generated), finish_detail ("length_incomplete": a constraint cut short),
                usage.prompt_tokens_details.cached_tokens
    select   POST /v1/completions {prompt: [[prefix + choice], ...], echo: true, logprobs: 0, max_tokens: 0,
             prompt_logprobs_start: len(prefix)}  -> each choice's token log-probabilities (`serving/echo.py`)

Reuse comes from the server's prefix cache: each call's prompt extends the previous one's tokens, so its full blocks
are found there. Nothing is pinned (`pin` only records what the server computed): under memory pressure the
server may evict a prefix and compute it again, which the token counts show; `hp.remote(url, cache_retention_s=)`
asks the server to pin each gen's prompt for that long (`cache_retention_seconds`). The server checks and compiles
every constraint; token healing (`heal=True`) needs a processor object and is refused here.

When made, the backend checks that its tokenizer is the server's (the server's `/tokenize` must give the same ids for
a probe text; `TokenizerError` otherwise). Each request has its own connection and a socket timeout (`timeout`: seconds without an answer). When the run is
aborted (the program raised, another call failed), the connections in flight are shut down; the server sees the
client leave and aborts their requests. Errors: `ServerUnavailableError` (cannot connect), `ServerTimeoutError`,
`ServerRequestError` (the server's 4xx/5xx, its message quoted).
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hf_paged.errors import TokenizerError
from hf_paged.programs.backend import (
    Generated,
    GenRequest,
    Guide,
    RunContext,
    Scored,
    continuation_ids,
    continuation_texts,
    guide_processor,
)
from hf_paged.programs.errors import (
    FieldConstraintError,
    ServerRequestError,
    ServerTimeoutError,
    ServerUnavailableError,
)
from hf_paged.programs.track import Track

__all__ = ["HTTPBackend", "RemoteModel", "remote"]

_PROBE = 'Ticket #12: "refund" {\n\t"a": [1, 2.5]} caf\u00e9 \u20ac \U0001f600 end.'  # words, digits, JSON, non-ASCII


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """Where a served model is: `hp.remote(url)` makes one; pass it where a program takes a model."""

    url: str  # the server's base URL (http or https), without /v1
    timeout: float = 120.0  # seconds one request may wait for its answer
    model: str | None = None  # the served model's name (None: the one the server lists)
    cache_retention_s: float | None = None  # each gen's prompt kept pinned on the server this long (None: no pin)


def remote(url: str, *, timeout: float = 120.0, model: str | None = None,
           cache_retention_s: float | None = None) -> RemoteModel:
    """A running `hf-paged serve` at `url` (e.g. "http://127.0.0.1:8000"), for `run`, `run_batch` and `fill`.

    `cache_retention_s`: each `gen` asks the server to keep its prompt's blocks pinned that long
    (`cache_retention_seconds`), as the in-process backend pins a state's prefix between calls; the server bounds it
    (`--max-cache-retention`) and refuses pins past its `prefix_pin_share`. None: the prefix cache alone (LRU)."""
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ValueError(f"hp.remote: url must be http(s)://host:port of a running hf-paged serve, got {url!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"hp.remote: timeout must be a number of seconds > 0, got {timeout!r}")
    if cache_retention_s is not None and (isinstance(cache_retention_s, bool)
                                          or not isinstance(cache_retention_s, int | float) or not cache_retention_s > 0):
        raise ValueError(f"hp.remote: cache_retention_s must be None or seconds > 0, got {cache_retention_s!r}")
    return RemoteModel(url.rstrip("/").removesuffix("/v1"), float(timeout), model,
                       None if cache_retention_s is None else float(cache_retention_s))


class HTTPBackend:
    """A served model and its tokenizer (the server's own: token ids cross the wire). When made, asks the server
    for its model name, block size and EOS ids, and checks the tokenizer against the server's (`/tokenize`)."""

    supports_healing = False

    def __init__(self, server: RemoteModel, tokenizer: Any) -> None:
        if tokenizer is None or not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(f"a program over HTTP needs the served model's tokenizer, got {type(tokenizer).__name__};"
                            " pass AutoTokenizer.from_pretrained(...) for the model the server runs")
        self.server = server
        self.tokenizer = tokenizer
        parts = urlsplit(server.url)
        self._https = parts.scheme == "https"
        self._host, self._port, self._path = parts.hostname, parts.port, parts.path
        listing = self._request(None, "GET", "/v1/models", None, "hp.remote")
        entries = {entry["id"]: entry for entry in listing.get("data", [])}
        if server.model is not None and server.model not in entries:
            raise ServerRequestError(f"hp.remote: the server at {server.url} serves {sorted(entries)}, not "
                                     f"{server.model!r}", status=404, code="model_not_found", param="model")
        name = server.model or next(iter(entries), None)
        entry = entries.get(name, {})
        self.model_name = name
        self._block_size = int(entry.get("block_size", 16))
        eos = entry.get("eos_token_ids")
        if eos is None:
            eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.eos_ids = frozenset(eos)
        self._check_tokenizer()

    @property
    def block_size(self) -> int:
        return self._block_size

    def _check_tokenizer(self) -> None:
        """The server's `/tokenize` (vLLM's) must give this tokenizer's ids for a probe text: ids from another
        tokenizer would run as some other text, a silent wrong answer. A server without `/tokenize` is not checked."""
        body = {"model": self.model_name, "prompt": _PROBE, "add_special_tokens": True}
        try:
            theirs = self._request(None, "POST", "/tokenize", body, "hp.remote")["tokens"]
        except ServerRequestError as exc:
            if exc.status == 404 and exc.param != "model":
                return
            raise
        mine = self.encode(_PROBE, first=True)
        if theirs != mine:
            raise TokenizerError(f"hp.remote: the tokenizer given is not the server's: it encodes {_PROBE!r} as "
                                 f"{mine[:12]}..., the server at {self.server.url} as {theirs[:12]}...; pass the "
                                 "tokenizer of the model the server runs")

    def encode(self, text: str, *, first: bool) -> list[int]:
        if first:
            return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        return continuation_ids(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        """The text `ids` add after what precedes them (`continuation_texts`)."""
        return continuation_texts(self.tokenizer, [ids])[0]

    def generate(self, run: RunContext, request: GenRequest) -> Generated:
        if request.healing is not None:
            raise FieldConstraintError(f"{request.what}: token healing needs the in-process backend")
        body: dict[str, Any] = {"model": self.model_name, "prompt": request.prompt, "max_tokens": request.max_tokens,
                                "temperature": request.temperature if request.sampled else 0,
                                "top_p": request.top_p, "return_token_ids": True}
        if request.seed is not None:
            body["seed"] = request.seed
        if request.stop:
            body["stop"] = list(request.stop)
        if self.server.cache_retention_s is not None:
            body["cache_retention_seconds"] = self.server.cache_retention_s
        guide = request.guide
        if guide is not None:
            if guide.kind == "grammar" and guide.start != "start":
                raise FieldConstraintError(f"{request.what}: the server's guided_grammar starts at rule 'start', not "
                                           f"{guide.start!r}; rename the rule or run in process")
            field = {"regex": "guided_regex", "json_schema": "guided_json", "grammar": "guided_grammar"}[guide.kind]
            body[field] = guide.spec
        data = self._request(run, "POST", "/v1/completions", body, request.what)
        choice = data["choices"][0]
        return Generated(list(choice["token_ids"]), choice.get("finish_detail") or choice["finish_reason"] or "length",
                         len(request.prompt), _cached(data))

    def accepts(self, guide: Guide, token_ids: Sequence[int]) -> bool:
        """Whether `token_ids` are a whole document of `guide`, asked of the processor built here (the server has no
        such question; the same processor from the same tokenizer gives the server's answer)."""
        return guide_processor(guide, self.tokenizer, sorted(self.eos_ids) or None).accepts(token_ids)

    def score(self, run: RunContext, what: str, prompts: list[list[int]], start: int) -> Scored:
        body = {"model": self.model_name, "prompt": prompts, "echo": True, "logprobs": 0, "max_tokens": 0,
                "prompt_logprobs_start": start}
        data = self._request(run, "POST", "/v1/completions", body, what)
        choices = sorted(data["choices"], key=lambda c: c["index"])
        logprobs = [[float(x) for x in c["logprobs"]["token_logprobs"][start:]] for c in choices]
        return Scored(logprobs, sum(len(p) - 1 for p in prompts), _cached(data))

    def pin(self, track: Track) -> None:
        """Nothing is pinned over HTTP: record the full blocks the server has computed (cached, evictable)."""
        size = self._block_size
        track.pinned = list(track.ids[: len(track.ids) // size * size]) or None

    def unpin(self, track: Track) -> None:
        track.pinned = None

    # -- the wire --------------------------------------------------------------------------------------------
    def _request(self, run: RunContext | None, method: str, path: str, body: dict | None, what: str) -> dict:
        """One request on its own connection; the answer's JSON, or a typed error. Cancelled with `run`."""
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = kind(self._host, self._port, timeout=self.server.timeout)
        url = self.server.url + path
        handle = None
        try:
            if run is not None:
                run.check_open()
            conn.connect()
            if run is not None:  # from here an abort shuts the socket down: the server sees the client leave
                sock = conn.sock
                handle = run.track(lambda: _shutdown(sock))
            payload = None if body is None else json.dumps(body).encode("utf-8")
            conn.request(method, self._path + path, body=payload, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
        except TimeoutError:
            raise ServerTimeoutError(f"{what}: {url} gave no answer within {self.server.timeout:g} s; the request was "
                                     "abandoned (the server aborts it); raise hp.remote(timeout=...)") from None
        except (OSError, http.client.HTTPException) as exc:
            if run is not None:
                run.check_open()  # aborted: that is why the connection went down
            reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else \
                f"{type(exc).__name__}: {exc}"
            raise ServerUnavailableError(f"{what}: cannot reach hf-paged serve at {self.server.url} ({reason}); start "
                                         "it (hf-paged serve --model PATH) or fix the URL") from None
        finally:
            if handle is not None:
                run.untrack(handle)
            conn.close()
        if run is not None:
            run.check_open()
        return _answer(what, url, response.status, raw)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


def _answer(what: str, url: str, status: int, raw: bytes) -> dict:
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if status == 200 and isinstance(data, dict):
        return data
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code, param, message = error.get("code"), error.get("param"), error.get("message")
        where = f" ({code}" + (f", param {param!r}" if param else "") + ")" if code or param else ""
        raise ServerRequestError(f"{what}: the server answered {status}{where}: {message}", status=status,
                                 code=code, param=param)
    text = raw[:300].decode("utf-8", "replace")
    raise ServerRequestError(f"{what}: {url} answered {status} without an OpenAI error body: {text!r}; is it "
                             "hf-paged serve?", status=status)


def _cached(data: dict) -> int:
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)
