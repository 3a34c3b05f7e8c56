"""Run one prepared OpenAI request on the engine loop: every prompt and fork becomes a choice, streamed as text.

    prompts x n forks --generate_async (one per prompt)--> RequestDelta --TextStream--> ChoiceEvent(index, text)
                                                                        --EntryStream--> its tokens' log-probabilities

Choice `i * n + k` is fork k of prompt i (OpenAI's order). Leaving the iteration early (client gone, task
cancelled) aborts every request still running.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from hf_paged.batching.engine_loop import EngineLoop
from hf_paged.batching.request import RequestStatus, fork_ids, fork_parent
from hf_paged.batching.retry import num_generated_tokens
from hf_paged.errors import HfPagedError
from hf_paged.serving.logprobs import EntryStream, LogprobEntry
from hf_paged.serving.metrics import ServerMetrics
from hf_paged.serving.prepare import PreparedRequest
from hf_paged.serving.text import TextStream

__all__ = ["ChoiceEvent", "Usage", "run_choices"]

_FINISH_REASONS = {"stop": "stop", "length": "length", "length_incomplete": "length", "stop_incomplete": "stop",
                   "abort": "abort"}


@dataclass(slots=True)
class ChoiceEvent:
    index: int
    text: str
    finish_reason: str | None = None  # set on the choice's last event
    error: str | None = None  # the request failed on the server (e.g. its logits processor raised)
    num_tokens: int = 0  # tokens behind this event
    error_type: type[BaseException] | None = None  # the class of the exception behind `error`
    token_ids: list[int] | None = None  # the tokens behind this event's text (and any held back before it)
    prompt_token_ids: list[int] | None = None  # on a choice's last event: its prompt
    finish_detail: str | None = None  # on the last event: the engine's own reason ("length_incomplete": a guided
    # output cut short by max_tokens before its constraint closed; the client sees "length"; "stop_incomplete":
    # ended by EOS after its constraint gave up, the client sees "stop")
    logprobs: list[LogprobEntry] | None = None  # the log-probabilities of this event's tokens (None: not asked)

    def error_status(self) -> tuple[int, str]:
        """(HTTP status, code) of a failed choice: 400 when the request itself was at fault (a typed
        `ValueError`/`TypeError` of `hf_paged.errors`, e.g. a schema over its compile budget), else 500."""
        if self.error_type is not None and issubclass(self.error_type, HfPagedError) \
                and issubclass(self.error_type, (ValueError, TypeError)):
            return 400, "invalid_request"
        return 500, "request_failed"


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


async def run_choices(
    loop: EngineLoop, prepared: PreparedRequest, tokenizer: Any, metrics: ServerMetrics, usage: Usage,
    received: float, on_queued: Callable[[], None] = lambda: None,
    on_prefilled: Callable[[int], None] | None = None,
) -> AsyncIterator[ChoiceEvent]:
    """Choice events of all prompts as they come; `usage` is filled in as requests end. `on_queued` runs as
    each prompt's request enters the loop's queue (so `loop.num_waiting` counts it from then on);
    `on_prefilled(i)` once prompt i is computed (its first token out: its full blocks are in the prefix cache)."""
    n = prepared.params.num_return_sequences
    usage.prompt_tokens = sum(len(p) for p in prepared.prompts)
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(i: int, prompt: list[int]) -> None:
        try:
            async with aclosing(loop.generate_async(prompt, prepared.params)) as deltas:
                # The first step of `deltas` queues the request before it can suspend, so no other handler runs
                # between this call and the queueing: admission never sees the prompt twice or not at all.
                on_queued()
                async for delta in deltas:
                    await queue.put((i, delta))
        except Exception as exc:  # noqa: BLE001 -- handed to the consumer, which answers with it
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prepared.prompts)]
    texts: dict[str, TextStream] = {}
    asks = prepared.params.logprobs is not None
    entries: dict[str, EntryStream] = {}  # request id -> its entries not sent yet (logprobs asked)
    unsent: dict[str, list[int]] = {}  # request id -> tokens whose text is held back (not in an event yet)
    index_of: dict[str, int] = {}
    timing: dict[str, float] = {}  # request id -> time of its last token
    remaining = len(prepared.prompts) * n
    try:
        while remaining:
            i, delta = await queue.get()
            if isinstance(delta, Exception):
                raise delta
            rid = delta.request_id
            if rid not in index_of:
                index_of.update({c: i * n + k for k, c in enumerate(fork_ids(fork_parent(rid), n))})
            if rid not in texts:  # (decoded after the prompt's last tokens: a first "▁Paris" reads " Paris")
                texts[rid] = TextStream(tokenizer, prepared.stop, context=prepared.prompts[i],
                                        min_tokens=prepared.params.min_new_tokens)
            stream = texts[rid]
            now = time.perf_counter()
            if delta.new_token_ids:
                if rid not in timing and on_prefilled is not None and fork_parent(rid) == rid:
                    on_prefilled(i)
                metrics.observe_tokens(now - timing[rid] if rid in timing else None, now - received)
                timing[rid] = now
            if asks and rid not in entries:
                entries[rid] = EntryStream(tokenizer, context=prepared.prompts[i])
            lps = entries.get(rid)
            if lps is not None:  # (before the text stream moves on: its text so far is where these tokens start)
                lps.push(delta.new_token_ids, delta.new_logprobs, len(stream.text))
            text = stream.push(delta.new_token_ids)
            ids = unsent.setdefault(rid, [])
            ids.extend(delta.new_token_ids)
            if not delta.finished:
                if text:
                    yield ChoiceEvent(index_of[rid], text, num_tokens=len(delta.new_token_ids), token_ids=ids,
                                      logprobs=lps.take(stream.num_sent) if lps is not None else None)
                    unsent[rid] = []
                continue
            remaining -= 1
            event = _last_event(index_of[rid], text + stream.finish(), delta, stream, usage, metrics, now - received)
            event.token_ids, event.prompt_token_ids = unsent.pop(rid), list(delta.output.prompt_ids)
            event.finish_detail = delta.output.finish_reason
            if lps is not None:
                event.logprobs = lps.take(stream.num_sent, final=True, cut=stream.stopped)
            yield event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _last_event(index, text, delta, stream: TextStream, usage: Usage, metrics: ServerMetrics, e2e: float):
    output = delta.output
    usage.completion_tokens += num_generated_tokens(output)  # max_retries: every attempt's, as /metrics counts
    if fork_parent(output.request_id) == output.request_id:  # forks share their parent's cached prompt
        # the prompt is billed once: its hit is the first attempt's (a retry's prompt comes back from the cache)
        usage.cached_tokens += output.attempts[0].num_cached_tokens if output.attempts else output.num_cached_tokens
    if output.status is RequestStatus.FAILED and output.finish_reason != "abort":  # counted by request_failed
        return ChoiceEvent(index, text, "error", output.error, len(delta.new_token_ids), output.error_type)
    reason = "stop" if stream.stopped else _FINISH_REASONS.get(output.finish_reason or "", "stop")
    if reason != "abort":  # an aborted choice (the server shut down) is request_aborted, not a success, no e2e
        metrics.observe_finished(reason, e2e, output)
    return ChoiceEvent(index, text, reason, num_tokens=len(delta.new_token_ids))
