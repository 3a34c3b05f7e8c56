"""What prompt chunks add to a step that carries decodes (`StepTimes`), and how a chunk is cut to a step's share
(`fit_chunk`). Measured on the engine's own timed steps; a budget sizes chunks, it never changes a token.

    decode_step(n)   a decode-only step with n decodes: a decayed line through the timed decode-only steps
    added(u, q)      = fixed + a * u + b * q: what a step's prompt work adds to a decode-only step of as many decodes
                     u: its prompt tokens, q: their query x key pairs, summed over its chunks:
                        pairs(n, c) = n * c + n * (n + 1) / 2    (n queries after c cached tokens, causal inside)
                     a decayed least-squares fit over the steps that carry both (each against `decode_step` of its
                     own decodes)
    budget(r, n)     prompt tokens at a token's cost a: (r - 1) * decode_step(n) - fixed, over a, at least 1
    pair_tokens      b / a: what one query x key pair costs in prompt tokens

Why the pairs: on the CPU a row of a chunk costs about a token of matmuls (~1 ms on the 60M model), whatever its
context, but attention over a long cached context does not: 16 tokens after 2k cached tokens added ~29 ms to a step
of 8 decodes where 16 fresh ones added ~11 (`benchmarks/mixed_step.py`). A line in u alone booked that attention as
its fixed part, so its budget was too generous for a chunk after a long context (the step that breaks the
inter-token p99) and too stingy for a fresh prompt (TTFT). With q apart, the scheduler prices each chunk by its own
context (`fit_chunk`): a chunk after a long context gets fewer tokens, a fresh prompt more.

Fallbacks, in this order, when the steps seen so far do not spread enough for a term or give it a sign it cannot
have (noise): fixed + a u + b q; a u + b q; fixed + a u; the average per token. And the fit is trusted only near
what it has seen: a chunk's pairs are held to twice the most pairs a timed mixed step carried (`pair_limit`; before
any, a fresh chunk of the token limit's), so the first chunks after a long context grow step by step while the fit
learns b instead of one step jumping to pairs it has never timed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ChunkFit", "StepCost", "StepTimes", "chunk_pairs", "fit_chunk"]

_KILO = 1e-3  # pairs enter the fit in thousands (a well-conditioned system next to token counts)
_MIN_PAIR_SPREAD = 0.05  # a pair term needs the steps' pairs to spread by 50 pairs (standard deviation) at least


def chunk_pairs(num_tokens: int, num_context: int) -> int:
    """Query x key pairs of a causal chunk of `num_tokens` queries after `num_context` cached tokens."""
    return num_tokens * num_context + num_tokens * (num_tokens + 1) // 2


@dataclass(frozen=True, slots=True)
class StepCost:
    """What prompt work adds to a step beside its decodes, in seconds: fixed + per_token u + per_pair q."""

    fixed: float  # once per step that carries any prompt work (its rows' metadata, leaving the decode-only path)
    per_token: float  # a prompt token's matmuls
    per_pair: float  # a query x key pair of attention (0 until the steps' pairs spread)


@dataclass(frozen=True, slots=True)
class ChunkFit:
    """A chunk cut to a step's share (`fit_chunk`)."""

    num_tokens: int  # tokens the chunk computes this step
    cost: int  # prompt-token equivalents it takes from the step's budget: tokens + pairs x pair_tokens, rounded up


def fit_chunk(num_wanted: int, num_context: int, budget: int, pair_tokens: float = 0.0,
              max_pairs: float | None = None) -> ChunkFit:
    """The most tokens (<= `num_wanted`) of a chunk after `num_context` cached tokens whose cost, tokens plus
    `pair_tokens` per query x key pair, stays within `budget` and whose pairs within `max_pairs`; at least 1 while
    the budget is not spent (a prompt always moves on; its cost may then take the rest of the budget)."""
    if num_wanted <= 0 or budget <= 0:
        return ChunkFit(0, 0)
    k = max(pair_tokens, 0.0)
    # n + k (n c + n (n + 1) / 2) <= budget:  (k / 2) n^2 + (1 + k c + k / 2) n - budget <= 0
    lin = 1 + k * num_context + k / 2
    n = budget / lin if k == 0 else (math.sqrt(lin * lin + 2 * k * budget) - lin) / k
    if max_pairs is not None:  # n c + n (n + 1) / 2 <= max_pairs
        c = num_context + 0.5
        n = min(n, math.sqrt(c * c + 2 * max_pairs) - c)
    n = max(1, min(num_wanted, math.floor(n + 1e-9)))
    while n > 1 and (n + k * chunk_pairs(n, num_context) > budget + 1e-9
                     or (max_pairs is not None and chunk_pairs(n, num_context) > max_pairs)):
        n -= 1  # floating-point edges of the roots
    return ChunkFit(n, math.ceil(n + k * chunk_pairs(n, num_context) - 1e-9))


class _Line:
    """A decayed least-squares line y = a + b x (b = 0 until the x values spread by at least one unit)."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def observe(self, x: float, y: float) -> None:
        d = self.decay
        self.w, self.x, self.y = self.w * d + 1, self.x * d + x, self.y * d + y
        self.xx, self.xy = self.xx * d + x * x, self.xy * d + x * y

    def coefficients(self) -> tuple[float, float] | None:
        if self.w <= 0:
            return None
        spread = self.w * self.xx - self.x * self.x  # w^2 * variance of x
        slope = (self.w * self.xy - self.x * self.y) / spread if spread >= self.w * self.w else 0.0
        return self.y / self.w - slope * self.x / self.w, slope


class _PlaneFit:
    """Decayed least squares of y over (1, u, q), with the fallbacks of the module docstring."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.m = np.zeros((3, 3))  # decayed sums of x x^T, x = (1, u, q in thousands)
        self.r = np.zeros(3)  # decayed sums of x y
        self.yy = 0.0  # decayed sum of y^2 (the residual's spread: is the pair term more than noise?)

    def observe(self, u: float, q: float, y: float) -> None:
        x = np.array([1.0, u, q * _KILO])
        self.m = self.m * self.decay + np.outer(x, x)
        self.r = self.r * self.decay + x * y
        self.yy = self.yy * self.decay + y * y

    def solve(self, prior_per_token: float | None = None, prior_weight: float = 0.0) -> StepCost | None:
        """The fit; with a prior on a token's cost (a prefill step's), a ridge pulls `per_token` towards it with
        `prior_weight` (in units of the sum of u^2: two steps of 16 tokens weigh 512). The pair term is kept only
        where it stands out of the noise (over twice its standard error)."""
        m, r, yy = self.m, self.r, self.yy
        w = m[0, 0]
        if w <= 0 or m[0, 1] <= 0:
            return None
        var_u = m[1, 1] / w - (m[0, 1] / w) ** 2
        var_q = m[2, 2] / w - (m[0, 2] / w) ** 2
        cov = m[1, 2] / w - m[0, 1] * m[0, 2] / w / w
        if prior_per_token is not None and prior_weight > 0:  # as if seen: sum (y - a0 u)^2 grows by nothing
            m, r = m.copy(), r.copy()
            m[1, 1] += prior_weight
            r[1] += prior_weight * prior_per_token
            yy = yy + prior_weight * prior_per_token ** 2
            var_u = max(var_u, 1.0)  # the prior pins the slope: no spread of u is needed
        u_spreads, q_spreads = var_u >= 1.0, var_q >= _MIN_PAIR_SPREAD ** 2
        apart = u_spreads and q_spreads and cov * cov < 0.98 * var_u * var_q  # u and q not one direction
        for cols, ok in (((0, 1, 2), apart), ((1, 2), q_spreads), ((0, 1), u_spreads)):
            if not ok:
                continue
            idx = np.array(cols)
            try:
                inverse = np.linalg.inv(m[np.ix_(idx, idx)])
            except np.linalg.LinAlgError:
                continue
            coef = inverse @ r[idx]
            full = dict(zip(cols, coef.tolist()))
            fixed, per_token, per_kilo = full.get(0, 0.0), full.get(1, 0.0), full.get(2, 0.0)
            if 2 in full:  # the pair term: only when over twice its standard error
                dof = w - len(cols)
                residual = (yy - float(coef @ r[idx])) / dof if dof > 0 else math.inf
                if per_kilo * per_kilo < 4 * max(residual, 0.0) * inverse[-1, -1]:
                    continue
            if fixed >= 0 and per_token > 0 and per_kilo >= 0:
                return StepCost(fixed, per_token, per_kilo * _KILO)
        average = self.r[0] / self.m[0, 1]  # sum of y over sum of u: the average per token
        return StepCost(0.0, average, 0.0) if average > 0 else None


class StepTimes:
    """A decode-only step's time and what prompt work adds to it (module docstring), from timed steps.

    Measured directly against a decode-only step of the same batch, not as a slope over whole steps (a decode
    replica's steps are all within a few tokens of each other: that fit fell back to its prior), and with the fixed
    part apart: as an average per token, small chunks looked dear (2-3 ms a token at 2-3 tokens against ~0.8 at 16),
    which shrank the budget, which made chunks smaller. None until both kinds of step were timed."""

    def __init__(self, decay: float = 0.95, prior_weight: float = 512.0) -> None:
        self.decay = decay
        # a prompt token's cost in a prefill step, once the cost model timed some: the prior of a token's cost beside
        # decodes, worth `prior_weight` (two steps of 16 tokens): a few noisy mixed steps of 2-6 tokens gave lines of
        # 0.2 ms a token + 9 ms fixed, a budget of 1 token and a load of 1 block a step
        self.prefill_token_seconds: float | None = None
        self.prior_weight = prior_weight
        self._decode_only = _Line(decay)  # seconds over decodes, decode-only steps
        self._added = _PlaneFit(decay)  # added seconds over (prompt tokens, pairs), steps carrying both
        self._num_decode_only = 0
        self.max_pairs = 0  # the most query x key pairs a timed step with decodes and prompt work carried

    def observe(self, num_tokens: int, num_prompt_tokens: int, seconds: float, num_pairs: int = 0) -> None:
        """A timed step: `num_tokens` in all, `num_prompt_tokens` of them prompt tokens (the rest decodes) with
        `num_pairs` query x key pairs (`chunk_pairs` summed over its chunks)."""
        num_decodes = num_tokens - num_prompt_tokens
        if seconds <= 0 or num_decodes <= 0:
            return  # nothing decoded in it: a prefill step, measured by the prefill rate
        if num_prompt_tokens == 0:
            self._decode_only.observe(num_decodes, seconds)
            self._num_decode_only += 1
            return
        base = self.decode_step(num_decodes)
        if base is not None:
            self._added.observe(num_prompt_tokens, num_pairs, seconds - base)
            self.max_pairs = max(self.max_pairs, num_pairs)

    def decode_step(self, num_decodes: float | None = None) -> float | None:
        """A decode-only step's seconds with `num_decodes` decodes (None: the observed mix's average)."""
        fit = self._decode_only.coefficients() if self._num_decode_only >= 2 else None
        if fit is None:
            return None
        line = self._decode_only
        x = line.x / line.w if num_decodes is None else num_decodes
        return max(fit[0] + fit[1] * x, 1e-9)

    def cost(self) -> StepCost | None:
        """What prompt work adds to a step (fixed, per token, per pair), or None until measured."""
        return self._added.solve(self.prefill_token_seconds, self.prior_weight)

    @property
    def token_seconds(self) -> float | None:
        fit = self.cost()
        return fit.per_token if fit is not None else None

    @property
    def pair_tokens(self) -> float:
        """A query x key pair's cost in prompt tokens (b / a); 0 until measured."""
        fit = self.cost()
        return fit.per_pair / fit.per_token if fit is not None else 0.0

    def pair_limit(self, limit_tokens: int) -> float:
        """The most pairs a chunk may carry: twice the most a timed step carried, at least a fresh chunk of
        `limit_tokens` tokens' (the fit is trusted near what it has seen)."""
        return max(2.0 * self.max_pairs, float(chunk_pairs(limit_tokens, 0)))

    def budget(self, ratio: float, num_decodes: int | None = None) -> int | None:
        base, fit = self.decode_step(num_decodes), self.cost()
        if base is None or fit is None:
            return None
        return max(1, int(((ratio - 1) * base - fit.fixed) / fit.per_token))
