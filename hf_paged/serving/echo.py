"""Scoring over HTTP: OpenAI's completions form `echo: true, logprobs: 0, max_tokens: 0` returns the prompt with
each prompt token's log-probability given the tokens before it. Each prompt runs as one scoring request of the
engine (`SamplingParams.score_targets`, the path of `hf_paged.api.scoring`): nothing is generated.

    prompt:   [t0 t1 t2 ... t(s-1) | ts ... t(L-1)]        s = prompt_logprobs_start (default 1)
    engine:   prompt [t0 .. t(L-2)], score_targets [ts .. t(L-1)]  (the positions before s may come from the cache)
    answer:   token_logprobs [null x s, logprob(ts), ..., logprob(t(L-1))]

`prompt_logprobs_start` is ours: OpenAI scores every token but the first, which computes the whole prompt; a client
that needs only a continuation's log-probabilities (a `select` over choices after a shared prefix) names where the
continuation starts, and the prefix before it comes from the prefix cache. `logprobs: N >= 1` adds each scored
position's N most likely tokens (`top_logprobs`, from the same log_softmax as the targets' values: a client tells
whether a token was the greedy one by comparing them, as lm-evaluation-harness does); `logprobs: 0` keeps
`top_logprobs` null.

`echo: true` with `max_tokens >= 1` generates as usual and puts the prompt before each choice's text; with
`logprobs: N` the prompt's entries (a scoring request per prompt, run beside the generation; the first token's
log-probability null) come before the generated ones (`echo_prefixes`, `with_prefix`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, Self

from hf_paged.batching.engine import Engine
from hf_paged.batching.engine_loop import EngineLoop
from hf_paged.batching.request import RequestOutput, RequestStatus
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import HfPagedError, PromptTooLongError
from hf_paged.serving.errors import ApiError
from hf_paged.serving.generation import ChoiceEvent, Usage
from hf_paged.serving.logprobs import LogprobEntry, TokenPieces, completion_logprobs
from hf_paged.serving.prepare import checked_bias
from hf_paged.serving.prompt_text import PromptText, prompt_text
from hf_paged.serving.protocol import CompletionRequest

__all__ = ["EchoPrefix", "EchoRequest", "EchoStream", "echo_choices", "echo_prefixes", "prepare_echo", "run_echo",
           "with_prefix"]


@dataclass(slots=True)
class EchoRequest:
    prompts: list[list[int]]  # the prompts as sent (tokenized)
    starts: list[int]  # each prompt's first scored position
    params: list[SamplingParams]  # one scoring request per prompt
    texts: list[PromptText] | None = None  # each prompt's echo (as sent; prepare_echo's); None: not shown


def prepare_echo(engine: Engine, tokenizer: Any, request: CompletionRequest,
                 tokenize: Callable[[str, str], list[int]]) -> EchoRequest:
    """The scoring requests of an echo request, or an `ApiError` (400) naming the field. `tokenize(text, param)`:
    the server's (`Preparer.tokenize`: a text too long to fit is refused before it is tokenized)."""
    checked_bias(request, engine.vocab_size)  # (read by no scoring, refused as a generation refuses it)
    prompts, starts, params, texts = [], [], [], []
    for prompt in request.prompts():
        ids = list(prompt) if isinstance(prompt, list) else list(tokenize(prompt, "prompt"))
        if len(ids) < 2:
            raise ApiError(f"echo scoring needs a prompt of at least 2 tokens (the first has no log-probability), "
                           f"got {len(ids)}", param="prompt", code="invalid_prompt")
        start = request.prompt_logprobs_start or 1
        if start >= len(ids):
            raise ApiError(f"prompt_logprobs_start={start} is past the prompt's last position ({len(ids) - 1}); give "
                           "a position inside the prompt", param="prompt_logprobs_start", code="invalid_value")
        if not 0 <= ids[-1] < engine.vocab_size:
            raise ApiError(f"token id {ids[-1]} is outside the vocabulary [0, {engine.vocab_size})", param="prompt",
                           code="invalid_prompt")
        scoring = SamplingParams(max_new_tokens=1, score_targets=ids[start:], logprobs=request.logprobs or None)
        error = engine.validate_prompt(ids[:-1], scoring)
        if error is not None:
            code = "context_length_exceeded" if isinstance(error, PromptTooLongError) else "invalid_prompt"
            raise ApiError(str(error), param="prompt", code=code)
        prompts.append(ids)
        starts.append(start)
        params.append(scoring)
        texts.append(prompt_text(tokenizer, prompt, ids))
    return EchoRequest(prompts, starts, params, texts)


async def run_echo(loop: EngineLoop, echo: EchoRequest, on_queued=lambda: None) -> list[RequestOutput]:
    """Run every prompt's scoring request in the continuous batch; their outputs in order. Cancelling the task
    aborts the requests still running."""

    async def one(prompt: list[int], params: SamplingParams) -> RequestOutput:
        output = None
        async with aclosing(loop.generate_async(prompt[:-1], params)) as deltas:
            on_queued()
            async for delta in deltas:
                if delta.finished:
                    output = delta.output
        assert output is not None, "the engine loop ended a request without an output"
        return output

    return list(await asyncio.gather(*(one(p, s) for p, s in zip(echo.prompts, echo.params))))


def _check_scored(output: RequestOutput) -> None:
    """Raise the `ApiError` of a scoring request that did not finish."""
    if output.status is RequestStatus.FINISHED:
        return
    if output.finish_reason == "abort":
        raise ApiError("the server shut down before the request finished; retry", status=503, code="shutting_down")
    client = isinstance(output.error_type, type) and issubclass(output.error_type, HfPagedError) \
        and issubclass(output.error_type, (ValueError, TypeError))
    raise ApiError(f"the request failed: {output.error}", status=400 if client else 500,
                   code="invalid_request" if client else "request_failed")


def prompt_entries(prompt: list[int], start: int, output: RequestOutput | None, pieces: TokenPieces,
                   text: PromptText) -> list[LogprobEntry]:
    """The prompt's entries: null before `start`, then the scored values (and alternatives, when asked); text
    offsets are where each token starts in the echoed text (`PromptText.offsets`)."""
    entries = []
    values = (output.score_logprobs or []) if output is not None else []
    tops = output.score_top_logprobs if output is not None else None
    for j, (token, at) in enumerate(zip(prompt, text.offsets(prompt, pieces.bytes), strict=True)):
        if j < start or j - start >= len(values):
            entries.append(LogprobEntry(token, None, None, at))
        else:
            entries.append(LogprobEntry(token, float(values[j - start]), tops[j - start] if tops else [], at))
    return entries


def echo_choices(echo: EchoRequest, outputs: list[RequestOutput], tokenizer: Any, usage: Usage, *,
                 return_token_ids: bool) -> list[dict]:
    """OpenAI completion choices with `logprobs` (tokens, token_logprobs, top_logprobs, text_offset); fills `usage`."""
    choices = []
    pieces = TokenPieces(tokenizer)
    assert echo.texts is not None, "echo_choices takes prepare_echo's request (each prompt's echo)"
    for index, (prompt, start, output, text) in enumerate(zip(echo.prompts, echo.starts, outputs, echo.texts)):
        _check_scored(output)
        usage.prompt_tokens += len(prompt)
        usage.cached_tokens += output.num_cached_tokens
        logprobs = completion_logprobs(prompt_entries(prompt, start, output, pieces, text), pieces)
        if output.score_top_logprobs is None:
            logprobs["top_logprobs"] = None  # logprobs: 0 scores the tokens only
        choice: dict[str, Any] = {
            "index": index, "text": text.text, "logprobs": logprobs,
            "finish_reason": "length",
        }
        if return_token_ids:
            choice.update(prompt_token_ids=list(prompt), token_ids=[], finish_detail="scored")
        choices.append(choice)
    return choices


@dataclass(slots=True)
class EchoPrefix:
    """What `echo: true` puts before a generated choice: its prompt's text, and with logprobs its entries."""

    text: str
    entries: list[LogprobEntry] | None  # None: logprobs not asked


def echo_scored(prompts: list[list[int]], logprobs: int | None) -> list[list[int]]:
    """The prompts echo with generation scores: with `logprobs`, those of 2+ tokens (one scoring request each)."""
    return [] if logprobs is None else [p for p in prompts if len(p) >= 2]


async def echo_prefixes(loop: EngineLoop, prompts: list[list[int]], texts: list[PromptText], pieces: TokenPieces,
                        logprobs: int | None, on_queued=lambda: None) -> list[EchoPrefix]:
    """Each prompt's prefix (its text as sent: `prompt_text.py`); with `logprobs`, its entries from one scoring
    request per prompt of 2+ tokens (run in the continuous batch beside the generation; its full blocks may serve
    both; `on_queued` as each is queued)."""
    if logprobs is None:
        return [EchoPrefix(text.text, None) for text in texts]
    scored = echo_scored(prompts, logprobs)
    params = [SamplingParams(max_new_tokens=1, score_targets=p[1:], logprobs=logprobs or None) for p in scored]
    outputs = iter(await run_echo(loop, EchoRequest(scored, [1] * len(scored), params), on_queued))
    prefixes = []
    for prompt, text in zip(prompts, texts):
        output = next(outputs) if len(prompt) >= 2 else None
        if output is not None:
            _check_scored(output)
        prefixes.append(EchoPrefix(text.text, prompt_entries(prompt, 1, output, pieces, text)))
    return prefixes


def with_prefix(event: ChoiceEvent, prefix: EchoPrefix) -> ChoiceEvent:
    """A whole choice with its prompt before it: text, and entries (the generated ones' offsets moved past it)."""
    entries = None
    if prefix.entries is not None:
        shift = len(prefix.text)
        entries = prefix.entries + [replace(e, offset=e.offset + shift) for e in event.logprobs or []]
    return replace(event, text=prefix.text + event.text, logprobs=entries)


class EchoStream:
    """Streamed echo: each choice's first chunk starts with its prompt (text and entries), later chunks' text offsets
    move past it. The prompts' scoring starts when the stream does (`async with`) and is cancelled when it ends."""

    def __init__(self, prefixes: Callable[[], Awaitable[list[EchoPrefix]]], n: int) -> None:
        self._start = prefixes
        self._n = n
        self._task: asyncio.Future[list[EchoPrefix]] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.ensure_future(self._start())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()  # aborts its scoring requests
            await asyncio.gather(self._task, return_exceptions=True)

    async def apply(self, event: ChoiceEvent, first: bool) -> ChoiceEvent:
        assert self._task is not None, "use EchoStream in `async with`"
        prefix = (await self._task)[event.index // self._n]
        if first:
            return with_prefix(event, prefix)
        if not event.logprobs:
            return event
        return replace(event, logprobs=[replace(e, offset=e.offset + len(prefix.text)) for e in event.logprobs])
