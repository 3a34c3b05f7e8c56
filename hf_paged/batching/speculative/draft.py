"""What a drafter proposes (`Draft`) and what a drafter is (`Proposer`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from hf_paged.batching.request import Request


@dataclass(slots=True)
class Draft:
    """A proposed continuation of one request."""

    token_ids: list[int]  # at most the number of tokens asked for; may be empty (nothing to propose)
    # [len(token_ids), vocab]: the distribution each token was drawn from (rejection sampling needs it); None for
    # a deterministic proposal (a point mass on each token, as prompt lookup's)
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """A drafter: proposes up to `num_tokens[i]` tokens after the last token of `requests[i]`."""

    def propose(self, requests: Sequence[Request], num_tokens: Sequence[int]) -> list[Draft]: ...

    def release(self, request_id: str) -> None:
        """Forget a request that ended (its per-request state, its blocks)."""

    def check_integrity(self, live_ids: set[str]) -> None:
        """Assert the drafter's invariants; it holds state only for `live_ids` (unfinished requests)."""
