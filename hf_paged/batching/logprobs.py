"""Log-probabilities of generated tokens (`SamplingParams.logprobs`): the chosen token's, and the k most likely.

They are read from the model's raw distribution at that step, `log_softmax(logits)`, before logits processors,
constraints, temperature and top-k/p (vLLM's default): what the model thinks of the token, not the sampler.

    rows of a step's logits   r0 r1 r2 r3          (rows 1 and 3 ask: params.logprobs is not None)
    asking rows               r1 r3  -> one log_softmax [2, vocab] -> top k (ties: lower token id first)
    after the pick            gather each chosen token's value  -> TokenLogprobs(token_id, logprob, top)

Only the rows that ask pay (one `index_select` and one `log_softmax` of those rows per step); the others' tokens are
picked exactly as before. Speculative decoding reads the same values from the verification rows (the row before
each emitted token), so a token's entry does not depend on whether it was drafted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = ["MAX_LOGPROBS", "RowLogprobs", "TokenLogprobs", "TopLogprob", "check_logprobs", "top_logprobs"]

# Most alternatives a request may ask for per token (OpenAI's limit for chat's top_logprobs; vLLM's default).
MAX_LOGPROBS = 20


class TopLogprob(NamedTuple):
    """One of the most likely tokens at a position."""

    token_id: int
    logprob: float


@dataclass(slots=True)
class TokenLogprobs:
    """One generated token's log-probability under the model's raw distribution, and the top alternatives."""

    token_id: int  # the token chosen
    logprob: float  # log_softmax(raw logits)[token_id]
    top: list[TopLogprob]  # the params.logprobs most likely tokens, most likely first (ties: lower id first)


def check_logprobs(value: object, field: str = "SamplingParams.logprobs") -> None:
    """Raise `InvalidConfigError` naming `field` unless `value` is None or an int in [0, MAX_LOGPROBS]."""
    from hf_paged.errors import InvalidConfigError

    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise InvalidConfigError(
            f"{field} must be None (off), 0 (the chosen token's log-probability only) or an int in 1..{MAX_LOGPROBS} "
            f"(also that many most likely tokens), got {value!r}"
        )


def top_logprobs(logprobs: torch.Tensor, ks: Sequence[int]) -> list[list[TopLogprob]]:
    """Row i's `ks[i]` most likely tokens of `logprobs` [rows, vocab], most likely first, equal values by token id.

    `torch.topk` does not promise an order among equal values; the top `max(ks) + 1` are taken and each row's first k
    sorted by (value, id). When the (k+1)-th value equals the k-th, a tie crosses the cut (tokens outside the set may
    have a lower id): that row is taken from a stable sort of the whole row."""
    vocab = logprobs.shape[-1]
    k_max = min(max(ks, default=0), vocab)
    if k_max == 0:
        return [[] for _ in ks]
    values, ids = torch.topk(logprobs, min(k_max + 1, vocab), dim=-1)
    out: list[list[TopLogprob]] = []
    for i, k in enumerate(ks):
        k = min(k, k_max)
        if k == 0:
            out.append([])
            continue
        row_values, row_ids = values[i].tolist(), ids[i].tolist()
        if k < len(row_values) and row_values[k] == row_values[k - 1]:  # a tie crosses the cut: lowest ids
            order = torch.sort(logprobs[i], descending=True, stable=True)
            pairs = list(zip(order.indices[:k].tolist(), order.values[:k].tolist()))
        else:
            pairs = sorted(zip(row_ids[:k], row_values[:k]), key=lambda p: (-p[1], p[0]))
        out.append([TopLogprob(int(t), float(v)) for t, v in pairs])
    return out


@dataclass(slots=True)
class RowLogprobs:
    """The raw log-probabilities of the rows that ask, computed once per step before processors edit the logits."""

    rows: list[int]  # the asking rows (indices into the step's logits)
    logprobs: torch.Tensor  # [len(rows), vocab] fp32: log_softmax of those rows' raw logits
    top: list[list[TopLogprob]]  # each asking row's top alternatives

    @classmethod
    def of(cls, logits: torch.Tensor, rows: list[int], ks: Sequence[int]) -> RowLogprobs:
        """`logits` [n, vocab] (raw); `rows` the asking rows, `ks` their params.logprobs."""
        index = torch.tensor(rows, device=logits.device)
        with torch.inference_mode():
            logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
        return cls(rows, logprobs, top_logprobs(logprobs, ks))

    def tokens(self, token_ids: Sequence[int | None]) -> list[TokenLogprobs | None]:
        """Entries of the chosen tokens, one per asking row in `rows` order (None where the row picked none)."""
        picked = [t if t is not None else 0 for t in token_ids]
        index = torch.tensor(picked, dtype=torch.long, device=self.logprobs.device)
        values = self.logprobs.gather(1, index[:, None]).squeeze(1).tolist()
        return [None if t is None else TokenLogprobs(int(t), float(v), top)
                for t, v, top in zip(token_ids, values, self.top)]
