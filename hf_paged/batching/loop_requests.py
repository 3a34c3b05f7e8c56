"""What the engine loop hands its callers: each step's `RequestDelta`s, and the `Submission` a synchronous caller
reads them from (`engine_loop.py`)."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from hf_paged.batching.interrupts import installed
from hf_paged.batching.logprobs import TokenLogprobs
from hf_paged.batching.request import RequestOutput, RequestStatus, StepOutput

__all__ = ["LoopClosedError", "Planned", "RequestDelta", "Submission"]


class LoopClosedError(RuntimeError):
    """The engine loop was shut down: it takes no new requests."""


@dataclass(slots=True)
class RequestDelta:
    """What one step gave one request: its new tokens, and its output once it has ended."""

    request_id: str
    new_token_ids: list[int]
    output: RequestOutput | None = None  # set on the request's last delta
    new_logprobs: list[TokenLogprobs] | None = None  # SamplingParams.logprobs: an entry per new token
    new_scores: list | None = None  # SamplingParams.output_scores: each new token's processed row of scores

    @property
    def finished(self) -> bool:
        return self.output is not None


_Put = Callable[[list[RequestDelta]], None]  # hands one step's deltas of one caller to that caller


@dataclass(slots=True, eq=False)
class _Sink:
    put: _Put
    tokens: bool  # every step's new tokens; False: only the ended requests (a caller that waits for results)


@dataclass(slots=True, eq=False, weakref_slot=True)
class Planned:
    """A submission whose ids are reserved and whose requests are not handed to the loop yet (`EngineLoop.enqueue`:
    when its caller starts following it, so that an exception or Ctrl-C in between leaves nothing running)."""

    request_ids: list[str] = field(default_factory=list)  # one per prompt
    all_ids: list[str] = field(default_factory=list)  # with the forks of num_return_sequences after their parent
    add: Callable[[], None] = lambda: None  # the loop command that adds the requests
    queued: list[bool] = field(default_factory=lambda: [False])  # enqueued, or ids given back (shared with a finalizer)


class _Loop(Protocol):
    """What a `Submission` asks of its `EngineLoop`."""

    def enqueue(self, planned: Planned, *, wake: bool = True) -> None: ...

    def follow(self, deltas: queue.SimpleQueue[list[RequestDelta]], pending: Callable[[], bool],
               on_lost: Callable[[], None]) -> Iterator[list[RequestDelta]]: ...

    def abort(self, *request_ids: str) -> None: ...


class Submission:
    """Requests submitted together by one synchronous caller; read them with `result()` or `steps()`. Nothing runs
    before the caller starts reading: dropped unread (an exception or Ctrl-C between `submit` and `result`), a
    submission gives its ids back and holds no block."""

    def __init__(self, loop: _Loop, planned: Planned, deltas: queue.SimpleQueue[list[RequestDelta]]) -> None:
        self.request_ids = planned.request_ids  # one per prompt, in order
        self.all_ids = planned.all_ids  # with the forks of num_return_sequences after their parent
        self._loop = loop
        self._planned = planned
        self._queue = deltas  # filled by the loop once the requests are enqueued
        self._remaining = set(planned.all_ids)
        self._cancelled = False

    def cancel(self) -> None:
        """Abort these requests (any thread): those running end before the next step; before `steps()` started,
        none will run."""
        self._cancelled = True
        if self._planned.queued[0] and self._remaining:
            self._loop.abort(*self._remaining)

    def steps(self) -> Iterator[list[RequestDelta]]:
        """Each step's deltas of these requests, as they come, until all have ended. Leaving early (an exception,
        Ctrl-C, `break`) aborts the requests still running. A Ctrl-C is held while this thread runs a step
        (`interrupts`)."""
        try:
            with installed():
                for deltas in self._loop.follow(self._queue, lambda: bool(self._remaining), self._lost, self._enqueue):
                    self._remaining.difference_update(d.request_id for d in deltas if d.finished)
                    yield deltas
        finally:
            if self._remaining:
                self._loop.abort(*self._remaining)

    def _enqueue(self) -> None:  # (once this caller drives, or another does: `EngineLoop.follow`)
        self._loop.enqueue(self._planned, wake=False)
        if self._cancelled:  # (`cancel` raced the enqueueing: one of the two aborts)
            self._loop.abort(*self._remaining)

    def _lost(self) -> None:  # nothing left to run, yet these never ended (a shutdown race)
        error = "the engine loop shut down before the request started"
        self._queue.put([RequestDelta(rid, [], RequestOutput(rid, [], [], RequestStatus.FAILED, error=error,
                                                              finish_reason="error")) for rid in self._remaining])

    def result(self, on_step: Callable[[StepOutput], None] | None = None) -> dict[str, RequestOutput]:
        """Wait for every request; `{request_id: output}` in submission order (forks after their parent).
        `on_step` sees each step's new tokens and ended requests of this submission."""
        outputs: dict[str, RequestOutput] = {}
        for deltas in self.steps():
            ended = [d.output for d in deltas if d.output is not None]
            for out in ended:
                outputs[out.request_id] = out
            if on_step is not None:
                on_step(StepOutput({d.request_id: d.new_token_ids for d in deltas if d.new_token_ids}, finished=ended,
                                   new_scores={d.request_id: d.new_scores for d in deltas if d.new_scores}))
        return {rid: outputs[rid] for rid in self.all_ids}
