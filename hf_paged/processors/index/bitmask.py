"""Token bitmasks: one preallocated int32 buffer per batch, applied to logits in place.

Layout (outlines-core's and xgrammar's): token `t` is allowed iff bit `t % 32` of word `t // 32` of its row is
set. A row of a 50k vocabulary is 1,571 words (6 KB) instead of a 50k-element boolean or a Python list of ids.

    logits row:   | 0 ............ vocab_size-1 | vocab_size ... width-1 |
    bitmask row:  | words covering the vocabulary | (no bits: padded rows) |
                                                    ^ always masked to -inf

`apply_token_bitmask_(logits, bitmask, rows=None, backend="auto")` has three interchangeable backends:
"torch" (the reference, any device), "numpy" (CPU fast path: one compiled loop per row, `mask_kernel`; a few
microseconds on a 50k row) and "triton" (CUDA kernel; also runs on CPU under `TRITON_INTERPRET=1`, which tests use).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hf_paged.processors.index.mask_kernel import mask_row, mask_row_numpy

__all__ = [
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "num_bitmask_words",
    "write_guide_mask",
]

BACKENDS = ("auto", "torch", "numpy", "triton")


def num_bitmask_words(vocab_size: int) -> int:
    """int32 words needed to hold one bit per token id."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """A zeroed `[num_rows, ceil(vocab_size / 32)]` int32 CPU tensor (pinned when CUDA is there, so the copy to
    the GPU can overlap). Guides write into it with `write_guide_mask`."""
    pin = torch.cuda.is_available()
    return torch.zeros((num_rows, num_bitmask_words(vocab_size)), dtype=torch.int32, pin_memory=pin)


def write_guide_mask(guide: Any, bitmask: torch.Tensor, row: int) -> None:
    """Fill `bitmask[row]` with the allowed tokens of an outlines-core `Guide` (outlines-core writes the words
    straight into our buffer: no list of ids is ever built)."""
    words = bitmask.shape[1]
    guide.write_mask_into(bitmask.data_ptr() + row * bitmask.stride(0) * 4, words, 4)


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError(
            f"apply_token_bitmask_ needs 2-D logits [rows, vocab] and bitmask [rows, words], got "
            f"{tuple(logits.shape)} and {tuple(bitmask.shape)}"
        )
    if bitmask.dtype != torch.int32:
        raise TypeError(f"the bitmask must be int32 (32 tokens per word), got {bitmask.dtype}")
    if rows is None and bitmask.shape[0] != logits.shape[0]:
        raise ValueError(
            f"bitmask has {bitmask.shape[0]} rows for {logits.shape[0]} logits rows: pass `rows=` to mask a subset"
        )
    if logits.stride(-1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary axis; call .contiguous() first")


def _as_rows(rows: Sequence[int] | torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if rows is None:
        return None
    if isinstance(rows, torch.Tensor):
        return rows.to(device=device, dtype=torch.int64)
    return torch.as_tensor(list(rows), dtype=torch.int64, device=device)


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: Sequence[int] | torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Set every disallowed logit to -inf, in place, and return `logits`.

    Args:
        logits: `[batch, width]` scores; columns at or past `32 * bitmask.shape[1]` (padded embedding rows)
            are always masked.
        bitmask: `[batch, words]` int32 (row `i` masks logits row `i`).
        rows: only these row indices are masked (each with its own bitmask row); None: every row.
        backend: "auto" (triton on CUDA, numpy on CPU), "torch", "numpy" or "triton".

    Example:
        >>> logits = torch.zeros(1, 40)
        >>> mask = torch.tensor([[0b101, 0]], dtype=torch.int32)
        >>> apply_token_bitmask_(logits, mask)[0, :4].tolist()
        [0.0, -inf, 0.0, -inf]
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    row_ids = _as_rows(rows, logits.device)
    _check(logits, bitmask, row_ids)
    if row_ids is not None and row_ids.numel() == 0:
        return logits
    if backend == "auto":
        if logits.is_cuda:
            backend = "triton" if _triton_available() else "torch"
        else:
            backend = "numpy" if logits.dtype in (torch.float32, torch.float16, torch.float64) else "torch"
    if bitmask.device != logits.device:
        bitmask = bitmask.to(logits.device, non_blocking=True)
    if backend == "torch":
        _apply_torch(logits, bitmask, row_ids)
    elif backend == "numpy":
        _apply_numpy(logits, bitmask, row_ids)
    else:
        _apply_triton(logits, bitmask, row_ids)
    return logits


# -- torch reference ---------------------------------------------------------------------------------------
def _unpack_torch(words: torch.Tensor, width: int) -> torch.Tensor:
    """`[n, words]` int32 -> `[n, width]` bool (False past the bits the words hold)."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = ((words.unsqueeze(-1) >> shifts) & 1).bool().reshape(words.shape[0], -1)
    if bits.shape[1] >= width:
        return bits[:, :width]
    pad = torch.zeros((words.shape[0], width - bits.shape[1]), dtype=torch.bool, device=words.device)
    return torch.cat([bits, pad], dim=1)


def _apply_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    if rows is None:
        logits.masked_fill_(~_unpack_torch(bitmask, logits.shape[1]), float("-inf"))
        return
    sub = logits.index_select(0, rows)
    sub.masked_fill_(~_unpack_torch(bitmask.index_select(0, rows), logits.shape[1]), float("-inf"))
    logits.index_copy_(0, rows, sub)


# -- numpy CPU path ----------------------------------------------------------------------------------------
def _apply_numpy(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    """Each row by the compiled loop (`mask_kernel.mask_row`; its numpy twin for float16, which numba lacks)."""
    values = logits.detach().numpy()
    words = np.ascontiguousarray(bitmask.numpy())
    mask = mask_row if values.dtype in (np.float32, np.float64) else mask_row_numpy
    for row in range(values.shape[0]) if rows is None else rows.tolist():
        mask(values[row], words[row])


# -- Triton kernel -----------------------------------------------------------------------------------------
_KERNELS: dict[bool, Any] = {}


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _triton_kernel() -> Any:
    """Define the kernel on first use (TRITON_INTERPRET is read when `@triton.jit` runs, so one per mode)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    kernel = _KERNELS.get(interpret)
    if kernel is not None:
        return kernel
    import triton
    import triton.language as tl

    @triton.jit
    def _bitmask_kernel(
        logits_ptr, bitmask_ptr, rows_ptr, logits_stride, bitmask_stride, width, num_words,
        HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # grid: (masked rows, column blocks); each program stores -inf over its disallowed columns only
        if HAS_ROWS:
            row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
        else:
            row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        in_row = cols < width
        word_ids = cols // 32
        has_word = in_row & (word_ids < num_words)  # columns past the bitmask (padded vocab) read as 0
        words = tl.load(bitmask_ptr + row * bitmask_stride + word_ids, mask=has_word, other=0)
        allowed = ((words >> (cols % 32)) & 1) != 0
        minus_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
        tl.store(logits_ptr + row * logits_stride + cols, minus_inf, mask=in_row & ~allowed)

    _KERNELS[interpret] = _bitmask_kernel
    return _bitmask_kernel


def _apply_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    import triton

    kernel = _triton_kernel()
    if bitmask.stride(-1) != 1:
        bitmask = bitmask.contiguous()
    num_rows = logits.shape[0] if rows is None else rows.numel()
    block = 1024 if logits.is_cuda else 64  # the interpreter costs per element: keep CPU test blocks small
    grid = (num_rows, triton.cdiv(logits.shape[1], block))
    kernel[grid](
        logits, bitmask, rows if rows is not None else bitmask, logits.stride(0), bitmask.stride(0),
        logits.shape[1], bitmask.shape[1], HAS_ROWS=rows is not None, BLOCK=block,
    )  # fmt: skip
