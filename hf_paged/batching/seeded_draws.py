"""Seeded draws: a seeded request's token at output position j is a function of (seed, j, the distribution) alone.

    draw(p, j) = argmax_i p_i / E_i,   E ~ Exp(1)^vocab from a generator reseeded with digest(seed, j)

This is the exponential race (Gumbel-max: argmax log p_i + G_i); each token wins with probability p_i, as a
multinomial draw does (vLLM samples seeded rows the same way). Keying the noise by the position, not by a stream
that every draw advances, is what makes the tokens independent of how the work was cut into steps:

- speculative decoding: position j's token is the race's winner over the model's distribution, and a draft at j is
  kept exactly when it is that winner. For prompt lookup (a point-mass draft d) that happens with probability p(d),
  the acceptance rate of rejection sampling; a draft model draws its drafts from the same noise (the coupled race),
  so it guesses the winner whenever its own distribution ranks the same. The emitted tokens are those of decoding
  one token at a time, with or without speculation, however many drafts the step's budget let it verify.
- `constraint_mode="resample"`: the second pick after a refusal races over the masked distribution with the same
  noise, so it picks the allowed token with the most weight: mask mode's token (masking renormalises p over the
  allowed set, which keeps the order of p_i / E_i).
- preemption, swap, chunking, prefix hits, batch company: nothing a draw reads depends on them.

Unseeded rows are untouched: they draw with `torch.multinomial` from torch's global generator, in stock's row order
(stock `generate` parity under `torch.manual_seed`; see sampler.py).
"""

from __future__ import annotations

import hashlib

import torch

from hf_paged.batching.request import Request

__all__ = ["draw", "noise_seed", "request_seed"]

_TINY = torch.finfo(torch.float32).tiny  # Exp(1) noise can round to 0: p = 0 over 0 would be NaN (argmax's pick)


def request_seed(request: Request) -> int | None:
    """The seed of the request's draws: a fork's or retry's own (`Request.seed`), else `params.seed`."""
    return request.seed if request.seed is not None else request.params.seed


def noise_seed(seed: int, position: int) -> int:
    """The generator seed of output position `position`'s draw (a digest: no two (seed, position) pairs share a
    stream by arithmetic, as seed + position would make seed 1 at position 1 repeat seed 2 at position 0)."""
    digest = hashlib.blake2b(f"{seed}@{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def draw(request: Request, probs: torch.Tensor, position: int) -> int:
    """One token from `probs` (a [vocab] or [1, vocab] distribution) for the token at output position `position`:
    the seeded race when the request has a seed, else `torch.multinomial` on torch's global generator."""
    seed = request_seed(request)
    if seed is None:  # (the caller's shape: the global generator's stream as before)
        return int(torch.multinomial(probs, num_samples=1))
    flat = probs.reshape(-1)
    generator = request.generator_on(flat.device)
    generator.manual_seed(noise_seed(seed, position))
    noise = torch.empty(flat.shape, dtype=torch.float32, device=flat.device).exponential_(generator=generator)
    return int((flat.float() / noise.clamp_(min=_TINY)).argmax())
