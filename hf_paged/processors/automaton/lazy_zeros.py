"""Zero-filled arrays that cost nothing until written: a grammar automaton sizes its per-state arrays for a
million states and names a few thousand."""

from __future__ import annotations

import math
import mmap

import numpy as np

__all__ = ["lazy_zeros", "lazy_zeros_many"]

_MMAP_FROM = 1 << 20  # bytes: smaller arrays come from numpy's allocator as usual
_PAGE = mmap.PAGESIZE


def lazy_zeros(shape: int | tuple[int, ...], dtype: type) -> np.ndarray:
    """`np.zeros(shape, dtype)`; from 1 MB on, on its own anonymous mapping in 4 KB pages, zeroed by the OS on
    first touch. (`np.zeros` of a big array either memsets memory the allocator reuses, ~3 ms per 16 MB on every
    compile, or asks the kernel for 2 MB pages, whose first touch zeroes all of one: milliseconds for a row.)"""
    shape = (shape,) if isinstance(shape, int) else shape
    size = math.prod(shape) * np.dtype(dtype).itemsize  # (not `np.prod`: ~10 us a call, a compile makes ~14)
    if size < _MMAP_FROM:
        return np.zeros(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, size), dtype=dtype).reshape(shape)


def lazy_zeros_many(*specs: tuple[int | tuple[int, ...], type]) -> list[np.ndarray]:
    """`[lazy_zeros(shape, dtype) for shape, dtype in specs]`, the arrays of 1 MB or more on one anonymous mapping
    (each at a page boundary): one mapping to set up and to tear down instead of one per array (~13 us each, and a
    grammar automaton makes seven)."""
    shapes = [((shape,) if isinstance(shape, int) else shape, dtype) for shape, dtype in specs]
    sizes = [math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in shapes]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        if size >= _MMAP_FROM:
            total += -(-size // _PAGE) * _PAGE
    mapping = mmap.mmap(-1, total) if total else None
    out = []
    for (shape, dtype), size, offset in zip(shapes, sizes, offsets):
        if size < _MMAP_FROM:
            out.append(np.zeros(shape, dtype=dtype))
        else:
            count = size // np.dtype(dtype).itemsize
            out.append(np.frombuffer(mapping, dtype=dtype, count=count, offset=offset).reshape(shape))
    return out
