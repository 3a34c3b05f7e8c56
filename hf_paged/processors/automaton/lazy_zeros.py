"""Zero-filled arrays that cost nothing until written: a grammar automaton sizes its per-state arrays for a
million states and names a few thousand."""

from __future__ import annotations

import math
import mmap

import numpy as np

__all__ = ["lazy_zeros"]

_MMAP_FROM = 1 << 20  # bytes: smaller arrays come from numpy's allocator as usual


def lazy_zeros(shape: int | tuple[int, ...], dtype: type) -> np.ndarray:
    """`np.zeros(shape, dtype)`; from 1 MB on, on its own anonymous mapping in 4 KB pages, zeroed by the OS on
    first touch. (`np.zeros` of a big array either memsets memory the allocator reuses, ~3 ms per 16 MB on every
    compile, or asks the kernel for 2 MB pages, whose first touch zeroes all of one: milliseconds for a row.)"""
    shape = (shape,) if isinstance(shape, int) else shape
    size = math.prod(shape) * np.dtype(dtype).itemsize  # (not `np.prod`: ~10 us a call, a compile makes ~14)
    if size < _MMAP_FROM:
        return np.zeros(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, size), dtype=dtype).reshape(shape)
