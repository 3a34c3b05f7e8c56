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
    global _HELPERS_DEFINED, triton, tl, load_kv_tile, find_seq_idx, attend_tile
    if _HELPERS_DEFINED:
        return
    triton = import_triton()
    import triton.language as tl

    _check_interpreter_consistent(tl)

    @triton.jit
    def load_kv_tile(head_ptr, block_ids, slot_offsets, dims, mask, stride_block, stride_slot):
        """One [BLOCK_N, BLOCK_D] tile of one KV head (`head_ptr` = cache + head * stride_head), gathered from
        its blocks; masked rows read 0.

        The single place where both attention kernels read the cache: a dequantizing variant replaces this load
        with load + scale, so the dequant step is fused where the tile is loaded.
        """
        ptrs = head_ptr + block_ids[:, None] * stride_block + slot_offsets[:, None] * stride_slot + dims[None, :]
        return tl.load(ptrs, mask=mask, other=0.0)

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
