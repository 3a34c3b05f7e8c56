"""Scoring over HTTP: OpenAI's completions form `echo: true, logprobs: 0, max_tokens: 0` returns the prompt with
each prompt token's log-probability given the tokens before it. Each prompt runs as one scoring request of the
engine (`SamplingParams.score_targets`, the path of `hf_paged.api.scoring`): nothing is generated.

    prompt:   [t0 t1 t2 ... t(s-1) | ts ... t(L-1)]        s = prompt_logprobs_start (default 1)
    engine:   prompt [t0 .. t(L-2)], score_targets [ts .. t(L-1)]  (the positions before s may come from the cache)
    answer:   token_logprobs [null x s, logprob(ts), ..., logprob(t(L-1))]

`prompt_logprobs_start` is ours: OpenAI scores every token but the first, which computes the whole prompt; a client
that needs only a continuation's log-probabilities (a `select` over choices after a shared prefix) names where the
continuation starts, and the prefix before it comes from the prefix cache. Top alternatives are not computed
(`logprobs` must be 0; `top_logprobs` is null).
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from hf_paged.batching.engine import Engine
from hf_paged.batching.engine_loop import EngineLoop
from hf_paged.batching.request import RequestOutput, RequestStatus
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import HfPagedError, PromptTooLongError
from hf_paged.serving.errors import ApiError
from hf_paged.serving.generation import Usage
from hf_paged.serving.protocol import CompletionRequest

__all__ = ["EchoRequest", "echo_choices", "prepare_echo", "run_echo"]


@dataclass(slots=True)
class EchoRequest:
    prompts: list[list[int]]  # the prompts as sent (tokenized)
    starts: list[int]  # each prompt's first scored position
    params: list[SamplingParams]  # one scoring request per prompt


def prepare_echo(engine: Engine, tokenizer: Any, request: CompletionRequest) -> EchoRequest:
    """The scoring requests of an echo request, or an `ApiError` (400) naming the field."""
    prompts, starts, params = [], [], []
    for prompt in request.prompts():
        ids = list(prompt) if isinstance(prompt, list) else list(tokenizer(prompt)["input_ids"])
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
        scoring = SamplingParams(max_new_tokens=1, score_targets=ids[start:])
        error = engine.validate_prompt(ids[:-1], scoring)
        if error is not None:
            code = "context_length_exceeded" if isinstance(error, PromptTooLongError) else "invalid_prompt"
            raise ApiError(str(error), param="prompt", code=code)
        prompts.append(ids)
        starts.append(start)
        params.append(scoring)
    return EchoRequest(prompts, starts, params)


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


def echo_choices(echo: EchoRequest, outputs: list[RequestOutput], tokenizer: Any, usage: Usage, *,
                 return_token_ids: bool) -> list[dict]:
    """OpenAI completion choices with `logprobs` (tokens, token_logprobs, top_logprobs, text_offset); fills `usage`."""
    choices = []
    for index, (prompt, start, output) in enumerate(zip(echo.prompts, echo.starts, outputs)):
        if output.status is not RequestStatus.FINISHED:
            if output.finish_reason == "abort":
                raise ApiError("the server shut down before the request finished; retry", status=503,
                               code="shutting_down")
            client = isinstance(output.error_type, type) and issubclass(output.error_type, HfPagedError) \
                and issubclass(output.error_type, (ValueError, TypeError))
            raise ApiError(f"the request failed: {output.error}", status=400 if client else 500,
                           code="invalid_request" if client else "request_failed")
        usage.prompt_tokens += len(prompt)
        usage.cached_tokens += output.num_cached_tokens
        tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in prompt]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        logprobs = [None] * start + [float(x) for x in output.score_logprobs or []]
        choice: dict[str, Any] = {
            "index": index, "text": tokenizer.decode(prompt, skip_special_tokens=False),
            "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets},
            "finish_reason": "length",
        }
        if return_token_ids:
            choice.update(prompt_token_ids=list(prompt), token_ids=[], finish_detail="scored")
        choices.append(choice)
    return choices
