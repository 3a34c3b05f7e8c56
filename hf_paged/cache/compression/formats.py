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
    log8           any scale as a uint8 code instead of fp16                int4 key 0.5 + 2/16 = 0.625,
                                                                              int4 value per_head 0.5 + 2/32 = 0.563
    rope_frequencies  int4 keys quantized in the block's RoPE frame (`key_frame`): same parts and bytes

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

`log8` (`PagedConfig.kv_scale_format="log8"`): a scale is stored as one byte c, meaning 2^((c - 160) / 10): 256
codes over 2^-16 .. 2^9.5 in steps of 2^0.1 = 7.2%. Encoding rounds UP to the next code, so no element clips: a
group's step grows by at most 7.2% (3.5% on average), its error likewise. The range covers real models' K/V: an
int4 group spans up to 15 x 724 (int8 amax up to 127 x 724, fp8 448 x 724); a group wider than that clips to the
largest code (an fp16 scale saturates at 65504 alike: an int4 group wider than ~1e6, int8 ~8e6, fp8 ~3e7 keeps
its values finite, its extremes clipped; an inf scale made every read of the block NaN); scales below 2^-16 are
stored as 2^-16, an absolute error under 2^-17. Zero points stay int8: an int4 scale + zero costs 2 bytes instead of 3, a third of the overhead that
keeps 4-bit caches above a quarter of bf16 (int4 keys per channel: 0.688 -> 0.625 bytes per element). An fp8
e4m3 scale would take one byte too, but its 3-bit mantissa steps by up to 12.5%. The fused kernels decode the
code where they load the scale (`kernels/triton_common.load_kv_tile`, the same fp32 arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hf_paged.cache.compression.key_frame import rotate_by_offset
from hf_paged.cache.huge_pages import pool_empty
from hf_paged.config import KV_CACHE_DTYPES as KV_FORMATS
from hf_paged.config import KV_SCALE_FORMATS as SCALE_FORMATS  # fp16 scales, or one-byte log codes
from hf_paged.config import VALUE_QUANT_GROUPS as VALUE_GROUPS  # scales per token, or per (token, KV head)

_FP8_MAX = 448.0  # largest finite float8_e4m3fn
_SCALE_DTYPE = torch.float16
_TINY = 2.0**-24  # smallest positive fp16: a scale of exactly 0 would turn an all-zero group into NaN
_HUGE = 65504.0  # largest finite fp16: a wider group's scale saturates here (its extremes clip) instead of inf -> NaN
LOG_SCALE_STEPS = 10  # log8 codes per octave: consecutive scales differ by 2^(1/10) = 7.2%
LOG_SCALE_ZERO = 160  # the log8 code of scale 1.0: codes 0..255 cover 2^-16 .. 2^9.5


@dataclass(slots=True, frozen=True)
class BlockFormat:
    """How one K or V tensor of a layer is stored. `per_channel`: scales over a block's tokens per (head, dim)."""

    name: str  # "auto" | "fp8" | "int8" | "int4"
    per_channel: bool = False  # int4 keys (KIVI); every other format is per token
    per_head: bool = False  # per-token scales split by KV head: one per (token, head) rather than per token
    log_scale: bool = False  # scales stored as uint8 log codes (`encode_log_scale`) instead of fp16
    # int4 keys in the block's RoPE frame (`key_frame`): each token's rotation by its slot offset undone before
    # quantizing, redone after dequantizing; () = as stored
    rope_frequencies: tuple[float, ...] = ()

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
        return {"data": data, "scale": torch.uint8 if self.log_scale else _SCALE_DTYPE, "zero": torch.int8}

    def allocate(self, num_blocks: int, block_size: int, num_heads: int, head_dim: int,
                 model_dtype: torch.dtype, device, *, huge_pages: bool = False) -> dict[str, torch.Tensor]:
        dtypes = self.part_dtypes(model_dtype)
        # uninitialised: pages are taken as blocks are first written (a zeroed pool is resident at once); a block is
        # read only after it was written whole. `huge_pages` (`PagedConfig.kv_huge_pages`): as `PagedLayer`'s pools
        return {name: pool_empty((num_blocks, *shape), dtypes[name], device, huge_pages=huge_pages)[0]
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
            x = rotate_by_offset(x, self.rope_frequencies, -1.0)  # a no-op without frequencies
            return _quantize_int4(x, self.per_channel, self.per_head, self.log_scale)
        # [n, bs] one scale per token over all its KV heads, or [n, bs, H] one per (token, head)
        amax = x.abs().amax(dim=3 if self.per_head else (2, 3))
        qmax = _FP8_MAX if self.name == "fp8" else 127.0
        scale, scale_value = _store_scale(amax / qmax, self.log_scale)
        scaled = x / _per_token(scale_value)
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
            return rotate_by_offset(_dequantize_int4(parts, self.per_channel), self.rope_frequencies, 1.0).to(dtype)
        return (parts["data"].float() * _per_token(scale_of(parts["scale"]))).to(dtype)


def encode_log_scale(scale: torch.Tensor) -> torch.Tensor:
    """fp32 scales -> uint8 log8 codes: the smallest code whose scale is >= the given one (rounded up, so nothing
    clips), within 0..255 (see the module docstring for the range)."""
    scale = scale.float()
    code = (torch.log2(scale.clamp(min=2.0**-16)) * LOG_SCALE_STEPS).ceil() + LOG_SCALE_ZERO
    code = code.clamp(0, 255)
    code = code + (decode_log_scale(code) < scale).float()  # log2 rounding may land one code short
    return code.clamp(0, 255).to(torch.uint8)


def decode_log_scale(code: torch.Tensor) -> torch.Tensor:
    """uint8 log8 codes -> fp32 scales 2^((code - 160) / 10), the arithmetic the Triton kernels repeat."""
    return torch.exp2((code.float() - float(LOG_SCALE_ZERO)) * (1.0 / LOG_SCALE_STEPS))


def scale_of(stored: torch.Tensor) -> torch.Tensor:
    """A stored scale part (fp16, or uint8 log8 codes) as fp32 scales."""
    return decode_log_scale(stored) if stored.dtype == torch.uint8 else stored.float()


def _store_scale(scale: torch.Tensor, log_scale: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored scale part, the fp32 scale it stands for): quantizing divides by the latter so that dequantizing
    is exact up to the rounding of the data."""
    if log_scale:
        code = encode_log_scale(scale)
        return code, decode_log_scale(code)
    stored = scale.clamp(min=_TINY, max=_HUGE).to(_SCALE_DTYPE)  # (inf in fp16 made every read of the group NaN)
    return stored, stored.float()


def _per_token(t: torch.Tensor) -> torch.Tensor:
    """A per-token scale or zero `[n, bs]` or per-(token, head) one `[n, bs, H]`, broadcast over `[n, bs, H, D]`."""
    return t[:, :, None, None] if t.dim() == 2 else t[..., None]


def _quantize_int4(x: torch.Tensor, per_channel: bool, per_head: bool = False,
                   log_scale: bool = False) -> dict[str, torch.Tensor]:
    # over the block's tokens per (head, dim) | over a token's dims per head | over a token's heads and dims
    dims = (1,) if per_channel else (3,) if per_head else (2, 3)
    low, high = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    # The zero point is an int8 in quantized units: the scale must also reach |low| / 127, so a group far from 0
    # (an outlier channel with a small range) trades resolution for range instead of being clipped.
    stored, scale = _store_scale(torch.maximum((high - low) / 15.0, low.abs() / 127.0), log_scale)
    # A group wider than the largest stored scale covers (fp16 65504, log8 2^9.5) keeps the 15 steps nearest 0 and
    # clips its extremes at both ends (from `low` up, its positive values all read back negative).
    centre = torch.clamp(torch.zeros_like(low), min=low + 7.5 * scale, max=high - 7.5 * scale)
    # (1.001: an fp16 scale rounded a hair below (high - low) / 15 is an ordinary group, zero-pointed as before)
    wide = high - low > 15.0 * 1.001 * scale
    zero = torch.where(wide, 7.5 - centre / scale, -low / scale).round().clamp(-128, 127)
    q = (x / scale + zero).round().clamp(0, 15).to(torch.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)  # even dims in the low nibble, odd dims in the high one
    shape = (x.shape[0], x.shape[2], x.shape[3]) if per_channel else x.shape[: 3 if per_head else 2]
    return {"data": packed, "scale": stored.reshape(shape), "zero": zero.reshape(shape).to(torch.int8)}


def _dequantize_int4(parts: dict[str, torch.Tensor], per_channel: bool) -> torch.Tensor:
    packed = parts["data"]
    q = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).float()  # [n, bs, H, D]
    scale, zero = scale_of(parts["scale"]), parts["zero"].float()
    if per_channel:
        scale, zero = scale[:, None], zero[:, None]
    else:
        scale, zero = _per_token(scale), _per_token(zero)
    return (q - zero) * scale


def formats_for(key_dtype: str, value_dtype: str, value_group: str = "token", scale_format: str = "fp16",
                key_rope_frequencies: tuple[float, ...] = ()) -> tuple[BlockFormat, BlockFormat]:
    """The (key, value) formats of a config's `key_dtype` / `value_dtype` names, `value_quant_group` and
    `kv_scale_format`; `key_rope_frequencies`: int4 keys quantized in the block's RoPE frame (`key_frame`)."""
    for field, name in (("key_cache_dtype", key_dtype), ("value_cache_dtype", value_dtype)):
        if name not in KV_FORMATS:
            raise ValueError(f"PagedConfig.{field} must be one of {list(KV_FORMATS)}, got {name!r}")
    if value_group not in VALUE_GROUPS:
        raise ValueError(f"PagedConfig.value_quant_group must be one of {list(VALUE_GROUPS)}, got {value_group!r}")
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"PagedConfig.kv_scale_format must be one of {list(SCALE_FORMATS)}, got {scale_format!r}")
    per_head = value_group == "head" and value_dtype != "auto"
    log = scale_format == "log8"
    frequencies = tuple(key_rope_frequencies) if key_dtype == "int4" else ()
    return (BlockFormat(key_dtype, per_channel=key_dtype == "int4", log_scale=log and key_dtype != "auto",
                        rope_frequencies=frequencies),
            BlockFormat(value_dtype, per_head=per_head, log_scale=log and value_dtype != "auto"))
