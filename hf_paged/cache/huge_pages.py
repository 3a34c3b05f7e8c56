"""Block-pool storage on 2 MB-aligned memory with transparent huge pages requested (Linux CPU tensors).

A fresh pool is untouched memory: the first write of each 4 KiB page costs a page fault (measured on this project's
machine as a visible share of a first request's time). `pool_empty` maps the pool with `mmap`, aligns it to 2 MiB
and asks the kernel for huge pages (`madvise(MADV_HUGEPAGE)`), so one fault maps 2 MiB. Whether the kernel grants
them is its policy: `thp_mode()` reads `/sys/kernel/mm/transparent_hugepage/enabled` ("always", "madvise" or
"never"; None where the file does not exist). Nothing here fails where huge pages are not available: the tensor is
then ordinary anonymous memory (or plain `torch.empty` off Linux / off the CPU).

Measured in `benchmarks/block_size.py --pages` (see `benchmarks/block_size_results.md`); not used by the engine
by default (see the results for why).
"""

from __future__ import annotations

import mmap
import sys
from dataclasses import dataclass

import torch

HUGE_PAGE_BYTES = 2 << 20  # the x86-64 / arm64 (4 KiB base pages) PMD size
_THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = _THP_ENABLED) -> str | None:
    """The kernel's transparent-huge-page policy: the bracketed word of `enabled` ("always", "madvise", "never"),
    None where it cannot be read (not Linux, no THP support)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


@dataclass(slots=True, frozen=True)
class PoolMemory:
    """How a pool tensor's memory was obtained."""

    aligned: bool  # its data starts on a 2 MiB boundary (mmap-backed)
    huge_pages_requested: bool  # madvise(MADV_HUGEPAGE) succeeded on it
    thp_mode: str | None  # the kernel's policy when it was allocated


def pool_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str | None = None, *,
               huge_pages: bool = True) -> tuple[torch.Tensor, PoolMemory]:
    """An uninitialised tensor for block storage. On a Linux CPU with `huge_pages`: 2 MiB-aligned anonymous memory
    with `MADV_HUGEPAGE` asked for (where the kernel's policy is not "never"); anywhere else `torch.empty`.

    Example:
        >>> t, how = pool_empty((4, 16, 2, 8), torch.float32)
        >>> tuple(t.shape), t.dtype
        ((4, 16, 2, 8), torch.float32)
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    mode = thp_mode()
    if not huge_pages or device.type != "cpu" or not sys.platform.startswith("linux") or mode in (None, "never"):
        return torch.empty(shape, dtype=dtype, device=device), PoolMemory(False, False, mode)
    elem = torch.empty((), dtype=dtype).element_size()
    count = 1
    for n in shape:
        count *= int(n)
    nbytes = max(count * elem, 1)
    length = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES  # whole huge pages, so the tail is one too
    region = mmap.mmap(-1, length + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive as long as any view of it
    offset = -base.data_ptr() % HUGE_PAGE_BYTES  # mmap gives 4 KiB alignment; skip to the next 2 MiB boundary
    requested = False
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            region.madvise(advice, offset, length)
            requested = True
        except OSError:  # a kernel without THP, or a policy that refuses: ordinary pages then
            requested = False
    data = base[offset:offset + count * elem].view(dtype).view(shape)
    return data, PoolMemory(True, requested, mode)


def huge_pages_in_use() -> int | None:
    """Bytes of this process's anonymous memory backed by transparent huge pages (`AnonHugePages` summed over
    `/proc/self/smaps_rollup`), None where it cannot be read: the check that a request was granted."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
