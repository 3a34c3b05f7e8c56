"""`tensor_checksum`: a 64-bit checksum of every bit of a tensor, computed with torch where the tensor lives.

The disk tier keys blocks by the model's fingerprint (`layout.model_fingerprint`), so the fingerprint must change
whenever any value that feeds keys and values changes: one trained embedding row, one K/V projection row. Hashing
the bytes (blake2b) sees every bit but runs at ~1 GB/s on one CPU core and needs the bytes on the CPU; this reads
the tensor once where it is (CPU or GPU), as integer words:

    words w_i (the tensor's bytes as int32, or int16 / uint8 when the size asks) ->  sum_i w_i * r_(i mod C) * c_j
    r: C fixed odd pseudo-random 64-bit weights; c_j = 2j + 1 for the j-th chunk of C words; all mod 2^64

Integer sums wrap the same way in any order, so the result does not depend on threads or devices (a float sum
would). A change of one word by d changes the sum by d * r * c mod 2^64, never 0 (r and c are odd, |d| < 2^32): a
single changed value is always seen; several changes cancel with probability about 2^-64, and a permutation of
values is seen unless it keeps every weighted sum.

Cost (2 CPU cores shared with other work, one torch thread, fp32): about 240 ms of CPU time per GB of weights
(blake2b: 1,130 ms, float64 sums: 1,090 ms; `benchmarks/kv_tier_results.md`). Computed only when an engine has a
KV store or a disk tier, when its first block is saved or looked up, and again after a prefix-cache reset.
"""

from __future__ import annotations

import torch

__all__ = ["tensor_checksum"]

_CHUNK = 1 << 20  # words per chunk: the int64 working buffer is 8 MiB
_MASK = (1 << 64) - 1
_weights: dict[torch.device, torch.Tensor] = {}


def _chunk_weights(device: torch.device) -> torch.Tensor:
    w = _weights.get(device)
    if w is None:
        g = torch.Generator(device="cpu").manual_seed(0x5EED_4B56)  # drawn on the CPU: the same words everywhere
        w = torch.randint(-(1 << 62), 1 << 62, (_CHUNK,), generator=g, dtype=torch.int64, device="cpu") * 2 + 1  # odd
        w = _weights[device] = w.to(device)
    return w


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat tensor of int32 words (int16 or uint8 when the byte count asks)."""
    flat = t.detach().reshape(-1)
    if not flat.is_contiguous() or flat.storage_offset() % 4:  # (a view of a fused weight may start unaligned)
        flat = flat.clone()
    data = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    for dtype, size in ((torch.int32, 4), (torch.int16, 2)):
        if data.numel() % size == 0:
            return data.view(dtype)
    return data


def tensor_checksum(t: torch.Tensor) -> int:
    """A 64-bit checksum of every bit of `t` (its values as stored, not its shape or dtype: hash those apart)."""
    if t.numel() == 0:
        return 0
    words = _words(t)
    w = _chunk_weights(words.device)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    buffer = torch.empty(min(_CHUNK, words.numel()), dtype=torch.int64, device=words.device)
    for j, start in enumerate(range(0, words.numel(), _CHUNK)):
        chunk = words[start : start + _CHUNK]
        part = buffer[: chunk.numel()]
        part.copy_(chunk)
        part.mul_(w[: chunk.numel()])
        total += part.sum() * (2 * j + 1)  # wraps mod 2^64, like every int64 product and sum here
    return int(total) & _MASK
