"""Keys in the block's RoPE frame (`PagedConfig.kv_key_derotate`): undo each token's rotation by its slot offset.

A cached key is RoPE-rotated by its position p = (block start) + offset. int4 keys are quantized per channel over
a block's tokens (KIVI), so a channel pair that RoPE turns fast sweeps its whole circle within a block and its
range is the key's full magnitude: on the trained default model, layer 0 head 0 keeps its energy in the four
fastest pairs (1, 0.37, 0.13, 0.05 rad per token), and its int4 keys alone cost KL 2.1e-3 on 768 held-out
positions. Rotating each token back by `offset * frequency` before quantizing leaves every token of the block in
the rotation of the block's first slot: what varies along the block is the key before RoPE, often nearly constant
per channel (positional heads). Measured: that head's KL 2.1e-3 -> 4e-5; all int4 keys 3.4e-3 -> 1.6e-3.

    stored = quantize(R(-offset * w) k)        read = R(offset * w) dequantize(stored)

Exact up to quantization for any frequencies `w` (a per-offset rotation, undone on read): the model's RoPE
frequencies only decide how much it helps. Pairs are rotate-half pairs (d, d + rotary_dim / 2), the transformers
convention; the dims past `rotary_dim` (partial rotary) are left alone. No bytes are added (the frequencies come
from the model's config). The fused Triton kernels do not rotate: layers in this frame take the torch read path.
"""

from __future__ import annotations

import torch


def rope_frequencies(config) -> tuple[float, ...]:
    """The RoPE inverse frequencies of a transformers config (decoder part), or () when it names none.

    Best effort on purpose: every cache reads it (`sizing.kv_shape_of`), only `kv_key_derotate` uses it, and that
    refuses a model without frequencies with a clear error."""
    try:
        return _rope_frequencies(config)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return ()


def _rope_frequencies(config) -> tuple[float, ...]:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None) or {}
    if isinstance(params, dict) and params and not isinstance(params.get("rope_theta"), (int, float)):
        params = next((p for p in params.values() if isinstance(p, dict) and "rope_theta" in p), {})  # per layer type
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    theta = theta or getattr(text, "rope_theta", None)
    num_heads = getattr(text, "num_attention_heads", None)
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // num_heads if num_heads else None)
    if not theta or not head_dim:
        return ()
    factor = params.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0)) if isinstance(
        params, dict) else 1.0
    dim = int(head_dim * (factor or 1.0)) // 2 * 2
    inv_freq = 1.0 / (float(theta) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    return tuple(float(f) for f in inv_freq)


def rotate_by_offset(x: torch.Tensor, frequencies: tuple[float, ...], sign: float) -> torch.Tensor:
    """Blocks `[n, bs, H, D]` with each token turned by `sign * offset * frequency` (offset: its slot in the block)."""
    half = len(frequencies)
    if not half:
        return x
    bs = x.shape[1]
    freqs = torch.tensor(frequencies, dtype=torch.float64, device=x.device)
    angles = (sign * torch.arange(bs, dtype=torch.float64, device=x.device)[:, None] * freqs).float()  # [bs, half]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x = x.float()
    a, b = x[..., :half], x[..., half : 2 * half]
    return torch.cat((a * cos - b * sin, b * cos + a * sin, x[..., 2 * half :]), dim=-1)
