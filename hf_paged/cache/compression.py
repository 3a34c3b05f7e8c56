"""Block formats of a compressed KV cache: quantize a full block once, dequantize what a step reads.

Every format stores one K or V tensor of a layer as named parts, each with the block id as its leading dim, so
block copies, swaps and gathers index every part alike:

    format  role   parts (shapes per block)                                   bytes / element, bs 16, 2x32 heads
    auto    any    data [bs, H, D] model dtype                                2 (bf16) / 4 (fp32)
    fp8     any    data [bs, H, D] float8_e4m3fn, scale [bs] fp16             1 + 2/64  = 1.031   (symmetric)
    int8    any    data [bs, H, D] int8, scale [bs] fp16                      1 + 2/64  = 1.031   (symmetric)
    int4    value  data [bs, H, D/2] uint8 (2 per byte), scale, zero [bs]     0.5 + 3/64 = 0.547  (asymmetric)
    int4    key    data [bs, H, D/2] uint8, scale fp16, zero int8 [H, D]      0.5 + 3/16 = 0.688  (per channel)
    per_head       scale (and zero) [bs, H] instead of [bs]                  int4 0.5 + 3/32 = 0.594, int8 1.063

Why these groupings: at 8 bits a per-token scale (shared by the token's KV heads) is accurate enough and keeps
the scale overhead at 2/(H*D) bytes; at 4 bits keys have outlier channels (RoPE pairs), so keys are quantized
per channel over the block (KIVI), values per token. Zero points are stored in quantized units (int8) rather
than as a float offset: one byte instead of two keeps int4 under a third of bf16 at block size 16.
Dequantized value: `(q - zero) * scale` (asymmetric) or `q * scale` (symmetric).

`per_head` (`PagedConfig.value_quant_group="head"`, values only): one scale (+ zero) per (token, KV head) instead
of per token. Measured on the trained model (960-token contexts, 24 texts, int4): it more than halves the value
half's KL (1.8e-3 -> 0.76e-3 with keys in full precision; all int4: top-1 0.958 -> 0.975) for 1.1% of the bf16
bytes (int4 30.9% -> 32.0%). Not used, because they did not pay off when simulated on the same texts: a
Walsh-Hadamard rotation of each head before quantizing (QuaRot-style incoherence processing: no gain on values
once they are per head, and on keys the KL nearly doubles, 3.3e-3 -> 6.2e-3: per-channel KIVI scales already
absorb the outlier channels that a rotation smears over every channel), and MSE-optimal clipping of each group
(no gain on either half). "token" stays the default: it keeps int4 within the 32% of bf16 the compression issue
allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hf_paged.config import KV_CACHE_DTYPES as KV_FORMATS
from hf_paged.config import VALUE_QUANT_GROUPS as VALUE_GROUPS  # scales per token, or per (token, KV head)

_FP8_MAX = 448.0  # largest finite float8_e4m3fn
_SCALE_DTYPE = torch.float16
_TINY = 2.0**-24  # smallest positive fp16: a scale of exactly 0 would turn an all-zero group into NaN


@dataclass(slots=True, frozen=True)
class BlockFormat:
    """How one K or V tensor of a layer is stored. `per_channel`: scales over a block's tokens per (head, dim)."""

    name: str  # "auto" | "fp8" | "int8" | "int4"
    per_channel: bool = False  # int4 keys (KIVI); every other format is per token
    per_head: bool = False  # per-token scales split by KV head: one per (token, head) rather than per token

    @property
    def is_quantized(self) -> bool:
        return self.name != "auto"

    def part_shapes(self, block_size: int, num_heads: int, head_dim: int) -> dict[str, tuple[int, ...]]:
        """Shapes (without the leading block dim) of the stored parts."""
        if self.name == "auto":
            return {"data": (block_size, num_heads, head_dim)}
        if self.name == "int4":
            if head_dim % 2:
                raise ValueError(f"int4 KV packs two values per byte and needs an even head_dim, got {head_dim}; "
                                 "use kv_cache_dtype='int8'")
            group = (num_heads, head_dim) if self.per_channel else self._token_group(block_size, num_heads)
            return {"data": (block_size, num_heads, head_dim // 2), "scale": group, "zero": group}
        return {"data": (block_size, num_heads, head_dim), "scale": self._token_group(block_size, num_heads)}

    def _token_group(self, block_size: int, num_heads: int) -> tuple[int, ...]:
        return (block_size, num_heads) if self.per_head else (block_size,)

    def part_dtypes(self, model_dtype: torch.dtype) -> dict[str, torch.dtype]:
        data = {"auto": model_dtype, "fp8": torch.float8_e4m3fn, "int8": torch.int8, "int4": torch.uint8}[self.name]
        return {"data": data, "scale": _SCALE_DTYPE, "zero": torch.int8}

    def allocate(self, num_blocks: int, block_size: int, num_heads: int, head_dim: int,
                 model_dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
        dtypes = self.part_dtypes(model_dtype)
        return {name: torch.zeros((num_blocks, *shape), dtype=dtypes[name], device=device)
                for name, shape in self.part_shapes(block_size, num_heads, head_dim).items()}

    def bytes_per_block(self, block_size: int, num_heads: int, head_dim: int, model_dtype: torch.dtype) -> int:
        dtypes = self.part_dtypes(model_dtype)
        total = 0
        for name, shape in self.part_shapes(block_size, num_heads, head_dim).items():
            total += int(torch.Size(shape).numel()) * torch.empty((), dtype=dtypes[name]).element_size()
        return total

    def quantize(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Full blocks `[n, bs, H, D]` -> stored parts (each with leading dim n)."""
        if self.name == "auto":
            return {"data": x}
        x = x.float()
        if self.name == "int4":
            return _quantize_int4(x, self.per_channel, self.per_head)
        # [n, bs] one scale per token over all its KV heads, or [n, bs, H] one per (token, head)
        amax = x.abs().amax(dim=3 if self.per_head else (2, 3))
        qmax = _FP8_MAX if self.name == "fp8" else 127.0
        scale = (amax / qmax).clamp(min=_TINY).to(_SCALE_DTYPE)
        scaled = x / _per_token(scale.float())
        if self.name == "fp8":
            data = scaled.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
        else:
            data = scaled.round().clamp(-127, 127).to(torch.int8)
        return {"data": data, "scale": scale}

    def dequantize(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Stored parts (leading dim n) -> `[n, bs, H, D]` in `dtype`."""
        if self.name == "auto":
            return parts["data"].to(dtype)
        if self.name == "int4":
            return _dequantize_int4(parts, self.per_channel).to(dtype)
        return (parts["data"].float() * _per_token(parts["scale"].float())).to(dtype)


def _per_token(t: torch.Tensor) -> torch.Tensor:
    """A per-token scale or zero `[n, bs]` or per-(token, head) one `[n, bs, H]`, broadcast over `[n, bs, H, D]`."""
    return t[:, :, None, None] if t.dim() == 2 else t[..., None]


def _quantize_int4(x: torch.Tensor, per_channel: bool, per_head: bool = False) -> dict[str, torch.Tensor]:
    # over the block's tokens per (head, dim) | over a token's dims per head | over a token's heads and dims
    dims = (1,) if per_channel else (3,) if per_head else (2, 3)
    low, high = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    # The zero point is an int8 in quantized units: the scale must also reach |low| / 127, so a group far from 0
    # (an outlier channel with a small range) trades resolution for range instead of being clipped.
    scale = torch.maximum((high - low) / 15.0, low.abs() / 127.0)
    scale = scale.clamp(min=_TINY).to(_SCALE_DTYPE).float()
    zero = (-low / scale).round().clamp(-128, 127)
    q = (x / scale + zero).round().clamp(0, 15).to(torch.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)  # even dims in the low nibble, odd dims in the high one
    shape = (x.shape[0], x.shape[2], x.shape[3]) if per_channel else x.shape[: 3 if per_head else 2]
    return {"data": packed, "scale": scale.reshape(shape).to(_SCALE_DTYPE), "zero": zero.reshape(shape).to(torch.int8)}


def _dequantize_int4(parts: dict[str, torch.Tensor], per_channel: bool) -> torch.Tensor:
    packed = parts["data"]
    q = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).float()  # [n, bs, H, D]
    scale, zero = parts["scale"].float(), parts["zero"].float()
    if per_channel:
        scale, zero = scale[:, None], zero[:, None]
    else:
        scale, zero = _per_token(scale), _per_token(zero)
    return (q - zero) * scale


def formats_for(key_dtype: str, value_dtype: str, value_group: str = "token") -> tuple[BlockFormat, BlockFormat]:
    """The (key, value) formats of a config's `key_dtype` / `value_dtype` names and `value_quant_group`."""
    for field, name in (("key_cache_dtype", key_dtype), ("value_cache_dtype", value_dtype)):
        if name not in KV_FORMATS:
            raise ValueError(f"PagedConfig.{field} must be one of {list(KV_FORMATS)}, got {name!r}")
    if value_group not in VALUE_GROUPS:
        raise ValueError(f"PagedConfig.value_quant_group must be one of {list(VALUE_GROUPS)}, got {value_group!r}")
    per_head = value_group == "head" and value_dtype != "auto"
    return BlockFormat(key_dtype, per_channel=key_dtype == "int4"), BlockFormat(value_dtype, per_head=per_head)


def index_parts(parts: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: t.index_select(0, idx) for name, t in parts.items()}


def assign_parts(parts: dict[str, torch.Tensor], idx: torch.Tensor, values: dict[str, torch.Tensor]) -> None:
    for name, t in parts.items():
        t.index_copy_(0, idx, values[name].to(t.dtype))
