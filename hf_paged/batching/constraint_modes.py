"""Constraint modes: how the sampler holds a constrained request (JSON schema, regex, choices) to its constraint.

    mask      logits --vocabulary mask--> processors, warpers --> pick                       (a mask every token)
    resample  logits --processors, warpers--> pick t --allowed(t)? yes--> t                  (no mask)
                                                                 \\- no --> mask, processors, warpers --> pick

Why resample gives mask mode's distribution: let p be the processed distribution of the unmasked row and A the
allowed tokens. For t in A, P(t) = p(t) + (1 - p(A)) * p(t) / p(A) = p(t) / p(A): the masked distribution,
provided the chain after the mask commutes with masking, i.e. acts on each token alone (temperature, repetition
penalty, EOS suppression). Truncating warpers (top-k, top-p, min-p, typical, epsilon, eta) do not: they keep
different tokens with and without the mask. So:
- sampling with `top_k`/`top_p` on `SamplingParams` and `constraint_mode="resample"` is refused at construction;
- a row whose processor list holds a truncating warper (a `GenerationConfig` made them processors) falls back to
  mask mode, as does a row that records `output_scores` (they must be the masked scores, as stock `generate`'s).
Greedy: the unconstrained argmax when allowed, else the masked argmax: the tokens of mask mode exactly (a
per-token chain commutes with the mask; a truncating warper keeps the top token either way). Processors we do not
know (a user's) are taken to act per token, as every stock transformers processor but the warpers above does.

The draws differ (a rejected token costs a second draw from the request's generator), so seeded sampled outputs of
the two modes are different samples of the same distribution. Jump-forward still reads the state's memoised mask
to find forced tokens; what resample saves is building and applying the mask on the sampled rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from hf_paged.batching.constraint_protocol import RequestConstraint
from hf_paged.batching.request import Request

__all__ = ["ConstraintStats", "resample_checks"]

# Warpers whose kept set depends on the other tokens' scores: masking before or after them differs.
TRUNCATING_WARPERS = (TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, TypicalLogitsWarper,
                      EpsilonLogitsWarper, EtaLogitsWarper)


@dataclass(slots=True)
class ConstraintStats:
    """Counters of the sampler's constraint work, read by `Engine.stats()`."""

    num_constrained_tokens: int = 0  # tokens sampled for requests with a constraint processor
    num_masks_computed: int = 0  # rows masked by a constraint (sampled rows and speculative verification rows)
    num_resampled_tokens: int = 0  # tokens sampled in resample mode
    num_rejections: int = 0  # of which the unconstrained draw was refused (a mask was then computed)

    def summary(self) -> dict:
        return {
            "constrained_tokens": self.num_constrained_tokens,
            "masks_computed": self.num_masks_computed,
            "masks_per_constrained_token": self.num_masks_computed / self.num_constrained_tokens
            if self.num_constrained_tokens else None,
            "resampled_tokens": self.num_resampled_tokens,
            "resample_rejections": self.num_rejections,
        }


def resample_checks(request: Request) -> list[RequestConstraint]:
    """The constraints to ask token by token when this row samples in resample mode, else [] (the row is masked;
    see the module docstring for the fallbacks). Memoised on the request: its params never change."""
    checks = request.resample_checks
    if checks is None:
        checks = request.resample_checks = _resample_checks(request)
    return checks


def _resample_checks(request: Request) -> list[RequestConstraint]:
    params, procs = request.params, request.processors
    if params.constraint_mode != "resample" or params.output_scores or not procs.constraints:
        return []
    if params.do_sample and any(isinstance(p.processor, TRUNCATING_WARPERS) for p in procs.row_processors):
        return []
    return list(procs.constraints)  # every constraint answers per-token checks (`RequestConstraint.allows`)
