"""What the Triton kernels share: the lazy Triton import and the jit helpers (K/V tile loader, softmax step).

Nothing here imports Triton at module level. The `@triton.jit` functions are defined on first use by
`define_jit_helpers()`, and as module globals, not closures: the interpreter (`TRITON_INTERPRET=1`) re-executes a
kernel's source against its module's globals, so a helper captured from an enclosing function would not be found.
The interpreter flag is read when `@triton.jit` runs, so importing this package early is harmless; importing
*triton* before the flag is set is not (its own `tl.max`, `tl.sum` are then compiled-mode), and
`_check_interpreter_consistent` turns that into a clear error. Tests set the flag in `tests/conftest.py`.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["define_jit_helpers", "import_triton", "interpreter_enabled", "jit_helpers"]

_HELPERS_DEFINED = False


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def import_triton() -> Any:
    """Import triton or raise an error saying how to get it, or how to do without it."""
    try:
        import triton
    except ImportError as exc:  # pragma: no cover - triton is a test dependency
        raise ImportError(
            "backend='triton' needs the triton package: `pip install triton` (or `pip install hf_paged[triton]`), "
            "or pass backend='torch'"
        ) from exc
    return triton


def define_jit_helpers() -> None:
    """Define the shared `@triton.jit` helpers (once) as globals of this module."""
    global _HELPERS_DEFINED, triton, tl, load_kv_tile, find_seq_idx, attend_tile, load_raw_tile, load_token_scales
    global attend_tile_folded
    if _HELPERS_DEFINED:
        return
    triton = import_triton()
    import triton.language as tl

    _check_interpreter_consistent(tl)

    @triton.jit
    def load_kv_tile(
        head_ptr, scale_ptr, zero_ptr, block_ids, slot_offsets, dims, rows, dim_mask, stride_block, stride_slot,
        stride_scale_block, stride_scale_slot, FMT: tl.constexpr, PER_CHANNEL: tl.constexpr,
    ):  # fmt: skip
        """One [BLOCK_N, BLOCK_D] tile of one KV head (`head_ptr` = cache + head * stride_head, `scale_ptr` /
        `zero_ptr` offset to the head too when PER_CHANNEL), gathered from its blocks and dequantized; rows off
        `rows` (and dims off `dim_mask`) read 0 from data, scale and zero alike, so NaN in unused slots, bytes or
        scales never reaches the arithmetic.

        The single place where both attention kernels read the cache. FMT (see `quantized.FORMAT_CODES`): 0 plain
        (returned in the cache dtype), 1 int8 / 2 fp8 / 4 fp8 decoded from bytes (`q * scale`, per token), 3 int4 (two per byte, even dims
        in the low nibble; `(q - zero) * scale`, per token or PER_CHANNEL): returned in fp32, the reference's
        `BlockFormat.dequantize` arithmetic, for the caller to round to the query dtype. FMT + 8 (`LOG_SCALE_CODE`):
        the same with uint8 log8 scale codes c, scale = 2^((c - 160) * 0.1) (`compression.decode_log_scale`).
        """
        mask = rows[:, None] & dim_mask[None, :]
        row_offsets = block_ids * stride_block + slot_offsets * stride_slot
        if FMT % 8 == 3 and dims.shape[0] < 32:
            # Tiles 16 wide keep the byte-per-element load: compiled for an H200 (triton 3.6), the joined tile
            # below gave wrong decode outputs at head_dim 16 in fp16 (right in the interpreter, in fp32, and at
            # head_dim 32 and 128), cause not found.
            packed = tl.load(head_ptr + row_offsets[:, None] + (dims // 2)[None, :], mask=mask, other=0)
            x = ((packed.to(tl.int32) >> ((dims % 2) * 4)[None, :]) & 15).to(tl.float32)
        elif FMT % 8 == 3:
            # The row's bytes as one contiguous [rows, BLOCK_D // 2] load (vectorized; indexing by `dims // 2`
            # made one 1-byte load per element: 6x slower on an H200), then each byte's two nibbles joined back
            # in place: element 2j is byte j's low nibble, 2j + 1 its high one.
            pairs = tl.arange(0, dims.shape[0] // 2)
            half_dim = tl.sum(dim_mask.to(tl.int32), 0) // 2
            packed = tl.load(head_ptr + row_offsets[:, None] + pairs[None, :],
                             mask=rows[:, None] & (pairs < half_dim)[None, :], other=0).to(tl.int32)
            x = tl.reshape(tl.join(packed & 15, (packed >> 4) & 15), (packed.shape[0], dims.shape[0])).to(tl.float32)
        elif FMT % 8 == 4:  # fp8 e4m3 from its bytes: GPUs before sm_89 have no fp8 conversion
            byte = tl.load(head_ptr + row_offsets[:, None] + dims[None, :], mask=mask, other=0).to(tl.int32)
            exponent, mantissa = (byte >> 3) & 15, byte & 7
            normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)  # bias 7 -> 127
            x = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
            x = tl.where((byte & 128) != 0, -x, x)
        else:
            x = tl.load(head_ptr + row_offsets[:, None] + dims[None, :], mask=mask, other=0.0)
        if FMT != 0:
            x = x.to(tl.float32)
            scale_offsets = block_ids * stride_scale_block + slot_offsets * stride_scale_slot
            if PER_CHANNEL:
                channel = scale_offsets[:, None] + dims[None, :]
                if FMT % 8 == 3:
                    x = x - tl.load(zero_ptr + channel, mask=mask, other=0).to(tl.float32)
                s = tl.load(scale_ptr + channel, mask=mask, other=0).to(tl.float32)
            else:
                if FMT % 8 == 3:
                    x = x - tl.load(zero_ptr + scale_offsets, mask=rows, other=0).to(tl.float32)[:, None]
                s = tl.load(scale_ptr + scale_offsets, mask=rows, other=0).to(tl.float32)[:, None]
            if FMT >= 8:
                s = tl.exp2((s - 160.0) * 0.1)  # compression.LOG_SCALE_ZERO / LOG_SCALE_STEPS
            x = x * s
        return x

    @triton.jit
    def load_raw_tile(head_ptr, block_ids, slot_offsets, dims, rows, dim_mask, stride_block, stride_slot):
        """One [BLOCK_N, BLOCK_D] tile of one KV head as stored (int8, fp8), not dequantized; masked reads 0."""
        offsets = (block_ids * stride_block + slot_offsets * stride_slot)[:, None] + dims[None, :]
        return tl.load(head_ptr + offsets, mask=rows[:, None] & dim_mask[None, :], other=0.0)

    @triton.jit
    def load_token_scales(scale_ptr, block_ids, slot_offsets, rows, stride_scale_block, stride_scale_slot,
                          FMT: tl.constexpr):
        """The per-token scales [BLOCK_N] of a tile (fp32; log8 codes decoded); rows off `rows` read 0."""
        s = tl.load(scale_ptr + block_ids * stride_scale_block + slot_offsets * stride_scale_slot, mask=rows,
                    other=0).to(tl.float32)
        if FMT >= 8:
            s = tl.where(rows, tl.exp2((s - 160.0) * 0.1), 0.0)
        return s

    @triton.jit
    def attend_tile_folded(q, k_raw, v_raw, k_scales, v_scales, seen, m_i, l_i, acc, qk_scale,
                           DOT_PRECISION: tl.constexpr):
        """`attend_tile` over a tile quantized per token (int8, fp8), its scales folded out of the tiles:
        q . (s_k[n] k[n]) = s_k[n] (q . k[n]) scales the scores' columns, and sum_n p[n] s_v[n] v[n] the
        probabilities' columns, so the stored values go to the dots as they are (exact in the query dtype:
        int8 and fp8 e4m3 fit in fp16 / bf16 / fp32) with no per-element multiply, and the tile loads feed the dots
        directly, as a bf16 cache's do."""
        scores = tl.dot(q, tl.trans(k_raw.to(q.dtype)), input_precision=DOT_PRECISION)
        scores = scores * (k_scales * qk_scale)[None, :]
        scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        weighted = (p * v_scales[None, :]).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(weighted, v_raw.to(q.dtype), input_precision=DOT_PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def attend_tile(q, k, v, seen, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
        """One step of the online softmax (base 2) over a key tile; `seen` [rows, BLOCK_N] masks keys out.

        `m_i` starts finite (-1e30), so rows that see no key keep exp2(m - m) = 1 and stay NaN-free.
        """
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def find_seq_idx(query_start_loc_ptr, tile_idx, num_seqs, BLOCK_Q: tl.constexpr):
        """Sequence owning query tile `tile_idx`: the last i with query_start_loc[i] // BLOCK_Q + i <= tile_idx.

        Sequence i's tiles start at query_start_loc[i] // BLOCK_Q + i, an upper bound of the tiles before it, so
        the grid needs no host-side count of tiles per sequence (no device sync).
        """
        lo: tl.int32 = 0
        hi = num_seqs
        while lo < hi:
            mid = (lo + hi) // 2
            first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
            if first_tile <= tile_idx:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    _HELPERS_DEFINED = True


def _check_interpreter_consistent(tl: Any) -> None:
    """Fail clearly when TRITON_INTERPRET=1 was set after triton was imported (transformers imports it).

    Triton's own `@jit` library (`tl.max`, `tl.sum`, ...) was then built for the compiler, and every kernel would
    die in the interpreter with "Cannot call @triton.jit'd outside of the scope of a kernel".
    """
    if not interpreter_enabled():
        return
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.standard.max, InterpretedFunction):
        raise RuntimeError(  # noqa: TRY004 - a setup-order problem, not a wrong argument type
            "TRITON_INTERPRET=1 was set after triton had been imported (transformers imports it), so triton's "
            "library is compiled-mode and the interpreter cannot run it; set TRITON_INTERPRET=1 before anything "
            "imports triton: in the environment, or at the top of tests/conftest.py"
        )


def jit_helpers() -> tuple[Any, Any, Any, Any]:
    """(triton.language, load_kv_tile, attend_tile, find_seq_idx), defining them on first call."""
    define_jit_helpers()
    return tl, load_kv_tile, attend_tile, find_seq_idx


def folded_helpers() -> tuple[Any, Any, Any]:
    """(load_raw_tile, load_token_scales, attend_tile_folded): a tile quantized per token, its scales folded
    into the scores and probabilities (see `attend_tile_folded`)."""
    define_jit_helpers()
    return load_raw_tile, load_token_scales, attend_tile_folded
