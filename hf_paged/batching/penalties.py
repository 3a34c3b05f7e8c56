"""OpenAI's sampling penalties on a request's row: `presence_penalty`, `frequency_penalty` and `logit_bias`.

- presence / frequency: subtracted from the logit of every token the request has *generated* (its prompt not
  counted), presence once, frequency once per occurrence: `row[t] -= frequency * count(t) + presence * (count(t) > 0)`,
  each in [-2, 2] (OpenAI's and vLLM's range; negative values encourage repetition).
- logit_bias: `{token id: bias}`, each bias in [-100, 100], added to the raw logit of that token at every step.

Where they sit in a row's chain (`sampler.py`), as vLLM orders them: min_new_tokens' EOS mask -> logit_bias -> the
request's logits processors (the server's `repetition_penalty`, which counts the prompt too, is one) -> presence and
frequency -> temperature, min-p, top-k, top-p. A constraint's mask (`-inf`) comes before all of them and stays `-inf`: a
bias or a negative penalty never lets through a token a JSON schema refuses.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import torch

from hf_paged.errors import InvalidConfigError

__all__ = ["MAX_BIAS", "MAX_PENALTY", "apply_logit_bias", "apply_output_penalties", "check_logit_bias",
           "check_penalty", "has_penalties"]

MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty| (OpenAI's range)
MAX_BIAS = 100.0  # |logit_bias| per token (OpenAI's range: -100 bans a token, 100 all but forces it)


def check_penalty(name: str, value: object) -> float:
    """`value` as a float in [-MAX_PENALTY, MAX_PENALTY], else `InvalidConfigError` naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not -MAX_PENALTY <= value <= MAX_PENALTY:
        raise InvalidConfigError(f"SamplingParams.{name} must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}] "
                                 f"(0: off), got {value!r}")
    return float(value)


def check_logit_bias(bias: object) -> dict[int, float] | None:
    """`bias` as `{token id: float}` (None or empty: None), else `InvalidConfigError` naming the bad entry. Ids are
    checked against the model's vocabulary when the request is added (`prompt_check.py`)."""
    if bias is None:
        return None
    if not isinstance(bias, Mapping):
        raise InvalidConfigError(f"SamplingParams.logit_bias must be a dict {{token id: bias}}, got "
                                 f"{type(bias).__name__}")
    checked: dict[int, float] = {}
    for token, value in bias.items():
        if isinstance(token, bool) or not hasattr(token, "__index__") or int(token) < 0:
            raise InvalidConfigError(f"SamplingParams.logit_bias keys must be token ids (ints >= 0), got {token!r}")
        if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
                or not -MAX_BIAS <= value <= MAX_BIAS):
            raise InvalidConfigError(f"SamplingParams.logit_bias[{int(token)}] must be a number in [-{MAX_BIAS:g}, "
                                     f"{MAX_BIAS:g}], got {value!r}")
        checked[int(token)] = float(value)
    return checked or None


def has_penalties(params) -> bool:
    """Whether `params` (`SamplingParams`) change a row beyond its processors and warpers."""
    return bool(params.logit_bias) or bool(params.presence_penalty) or bool(params.frequency_penalty)


def apply_logit_bias(row: torch.Tensor, bias: Mapping[int, float]) -> torch.Tensor:
    """`row` [1, vocab] with `bias` added to its tokens' logits (in place)."""
    ids = torch.tensor(list(bias), dtype=torch.long, device=row.device)
    row[0].index_add_(0, ids, torch.tensor(list(bias.values()), dtype=row.dtype, device=row.device))
    return row


def apply_output_penalties(row: torch.Tensor, params, output_ids: Sequence[int],
                           pending: Sequence[int] = ()) -> torch.Tensor:
    """`row` [1, vocab] less `params`' presence and frequency penalties over `output_ids` then `pending` (a
    speculative verification's drafts before this position), in place."""
    if not output_ids and not pending:
        return row
    generated = torch.tensor([*output_ids, *pending], dtype=torch.long, device=row.device)
    tokens, counts = torch.unique(generated, return_counts=True)
    penalty = counts.to(row.dtype) * params.frequency_penalty + params.presence_penalty
    row[0].index_add_(0, tokens, -penalty)
    return row
