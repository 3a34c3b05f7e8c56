"""What the engine asks of a request's logits processors: two declared kinds, sorted once when the request is made.

    SamplingParams.logits_processors --RequestProcessors.of (Request creation)--> constraints   | row_processors
                                                                                  (batched)     | (stock, per row)

- A **constraint** (`RequestConstraint`: our JSON schema / regex / choice / grammar processors) keeps its state per
  request id; the sampler masks all its rows of a step in one `process_rows` call, resample mode asks it about
  single tokens (`allows`), the engine starts its compile when the request is added (`prepare`), appends the tokens
  it forces (`forced_tokens`, jump-forward), asks whether a document cut by `max_new_tokens` is complete
  (`is_complete`) and frees its state when the request ends (`release`).
- Any other processor is a stock transformers `LogitsProcessor`, a plain callable `(input_ids, scores) -> scores`:
  wrapped once in `RowProcessor` and called per row with that request's own history, after the constraints' mask
  (the order in which the sampler always applied them).

A processor is a constraint when it declares `supports_continuous_batching = True` and implements every method of
the protocol; the engine and the sampler then call those methods directly, never probing for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["RequestConstraint", "RequestProcessors", "RowProcessor", "is_constraint"]


@runtime_checkable
class RequestConstraint(Protocol):
    """A constraint processor driven by the engine, its state keyed by request id (`GuidedLogitsProcessor`).

    `generated` is always the request's output so far (the prompt excluded); unknown request ids start fresh."""

    supports_continuous_batching: bool  # True: the engine's batched path (stock transformers processors say False)

    def prepare(self) -> None:
        """Start the constraint's compile in the background (idempotent; returns at once)."""

    def process_rows(self, request_ids: Sequence[str], generated: Sequence[Sequence[int]],
                     scores: torch.Tensor) -> torch.Tensor:
        """Mask `scores` [n, vocab] (in place, or return new scores): row `i` belongs to `request_ids[i]`."""

    def allows(self, request_id: str, generated: Sequence[int], token_id: int) -> bool:
        """Whether `token_id` may follow `generated`, without computing a vocabulary mask (resample mode)."""

    def forced_tokens(self, request_id: str, generated: Sequence[int], max_tokens: int) -> list[int]:
        """The tokens that are each the only allowed continuation (at most `max_tokens`; jump-forward)."""

    def is_complete(self, request_id: str, generated: Sequence[int] | None = None) -> bool:
        """Whether the request's document is complete (EOS allowed now, or produced), after `generated` (the
        request's whole output; None: as far as the constraint has read it, which may lack the last token)."""

    def error(self, request_id: str) -> str | None:
        """Why the constraint gave up on the request's document before it was complete (a token it refuses was
        produced, or no token spells what it allows next: it allows EOS alone from then on), or None. A request
        that then ends with EOS finishes `"stop_incomplete"`."""

    def release(self, request_id: str) -> None:
        """Forget the request's state (it ended)."""


def is_constraint(processor: Any) -> bool:
    """Whether the engine drives `processor` as a `RequestConstraint` (declared and implemented)."""
    return isinstance(processor, RequestConstraint) and bool(processor.supports_continuous_batching)


class RowProcessor:
    """A stock transformers `LogitsProcessor` (or any `(input_ids, scores) -> scores` callable) applied to one
    request's row with that request's own history as `input_ids` [1, tokens]."""

    __slots__ = ("processor",)

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, history: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        return self.processor(history, row)

    def __repr__(self) -> str:
        return f"RowProcessor({self.processor!r})"


@dataclass(frozen=True, slots=True)
class RequestProcessors:
    """A request's logits processors, sorted by kind (each kind in the order the caller gave)."""

    constraints: tuple[RequestConstraint, ...] = ()  # masked per batch by the sampler, before the row processors
    row_processors: tuple[RowProcessor, ...] = ()  # stock processors, called per row

    @classmethod
    def of(cls, processors: Iterable[Any]) -> RequestProcessors:
        constraints: list[RequestConstraint] = []
        rows: list[RowProcessor] = []
        for proc in processors:
            if is_constraint(proc):
                constraints.append(proc)
            else:
                rows.append(RowProcessor(proc))
        return cls(tuple(constraints), tuple(rows))

    def __bool__(self) -> bool:
        return bool(self.constraints or self.row_processors)
