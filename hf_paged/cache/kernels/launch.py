"""Launch parameters of the Triton kernels, chosen from shapes alone: pure Python, no Triton import.

No `@triton.autotune` (it crashes in the interpreter and hides what runs): each kernel's tile sizes, warps and
stages come from one heuristic function here, which the launcher calls and tests call too, so the constraints the
interpreter never checks (tl.dot sizes, power-of-two tiles, registers, shared memory) are asserted on the very
configs the GPU gets. `KernelLaunch` is a launch fully decided (kernel, grid, arguments): the launchers run it, and
`scripts/gpu_compile_check.py` compiles it for a GPU target on a machine without one.

Budgets: 128 registers per thread (of 255) by a rough count, and 64 KiB of shared memory for the K/V stages,
which every GPU since Volta has, with two CTAs per SM on recent ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "INT4_SPLIT_NIBBLES",
    "MAX_REGISTERS_PER_THREAD",
    "MAX_SHARED_MEMORY_BYTES",
    "MAX_SPLITS",
    "MIN_TILES_PER_SPLIT",
    "DecodeLaunchConfig",
    "KernelLaunch",
    "PrefillLaunchConfig",
    "StoreLaunchConfig",
    "choose_block_n",
    "choose_num_warps",
    "decode_launch_config",
    "next_power_of_2",
    "num_sms",
    "prefill_launch_config",
    "registers_per_thread",
    "shared_memory_bytes",
    "store_launch_config",
]

MAX_REGISTERS_PER_THREAD = 128
MAX_SHARED_MEMORY_BYTES = 64 * 1024
MIN_TILES_PER_SPLIT = 4  # a decode split shorter than this costs more in the merge than it wins in parallelism
MAX_SPLITS = 64
# int4 K and V: decode with the head dim split into even / odd nibble planes, scales folded out of per-token tiles
# (`triton_int4`), instead of joining each tile's nibbles back and dequantizing every element (`load_kv_tile`).
# The one switch of `DecodeLaunchConfig.split_nibbles`'s default; the GPU sweep times both ("int4:split" and
# "int4:join" in scripts/gpu_bench_decode.py). Off until a GPU lease has compiled, checked and timed it: the joined
# tiles are what tests/gpu passed on an H100 (2026-12-06); the split kernel has run in the interpreter only.
INT4_SPLIT_NIBBLES = False


@dataclass(slots=True)
class KernelLaunch:
    """One kernel launch, fully decided: `kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)`."""

    kernel: Any  # the @triton.jit function
    grid: tuple[int, ...]
    args: tuple[Any, ...]  # runtime arguments, in the kernel's order
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2

    def run(self) -> Any:
        """Launch; returns what Triton returns (its compiled kernel: `n_regs`, `n_spills` on a GPU)."""
        return self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps,
                                      num_stages=self.num_stages)


@dataclass(slots=True, frozen=True)
class StoreLaunchConfig:
    """Tile sizes of one `store_kv` launch (powers of two covering one token's rows)."""

    block_h: int  # num_kv_heads padded to a power of two
    block_d: int  # head_dim padded to a power of two
    num_warps: int


@dataclass(slots=True, frozen=True)
class DecodeLaunchConfig:
    """Tile sizes and launch parameters of one paged decode launch (all tile sizes powers of two)."""

    block_g: int  # rows of the QK^T dot: query heads of one KV head, padded to >= 16
    block_n: int  # keys per tile (independent of the cache block size); K of the P @ V dot, >= 16
    block_d: int  # head_dim padded to a power of two >= 16; K of the QK^T dot
    num_splits: int  # programs per (sequence, KV head) along the context
    num_warps: int
    num_stages: int
    dot_precision: str  # "ieee" for fp32 inputs (no silent tf32), "tf32" (ignored) for 16-bit inputs
    # K and V quantized per token (int8, fp8): fold their scales into the scores and probabilities instead of
    # dequantizing the tiles (`triton_common.attend_tile_folded`); ignored for other formats
    fold_scales: bool = True
    # K and V int4, head_dim >= 32: the split-nibble kernel (`triton_int4`); ignored for other formats
    split_nibbles: bool = INT4_SPLIT_NIBBLES


@dataclass(slots=True, frozen=True)
class PrefillLaunchConfig:
    """Tile sizes and launch parameters of one paged prefill launch."""

    block_m: int  # rows of the QK^T dot (power of two >= 16): block_q tokens x GROUP heads, padded
    block_q: int  # query tokens per tile: block_m // group (not necessarily a power of two)
    block_n: int  # keys per tile, power of two >= 16
    block_d: int  # head_dim padded to a power of two >= 16
    num_warps: int
    num_stages: int
    dot_precision: str  # "ieee" for fp32 inputs, "tf32" (ignored) for 16-bit inputs


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`; the interpreter gets a small pretend count."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def registers_per_thread(*, rows: int, block_n: int, block_d: int, elem_bytes: int, num_warps: int) -> int:
    """Rough 32-bit registers per thread held by an attention tile loop: fp32 accumulator [rows, block_d], fp32
    scores [rows, block_n] and the query tile [rows, block_d]; K/V tiles are staged in shared memory."""
    words = rows * block_d + rows * block_n + rows * block_d * elem_bytes // 4
    return words // (num_warps * 32)


def shared_memory_bytes(*, block_n: int, block_d: int, elem_bytes: int, num_stages: int) -> int:
    """Shared memory of the K and V tiles, `num_stages` deep (software pipelining)."""
    return 2 * block_n * block_d * elem_bytes * num_stages


def choose_block_n(*, block_d: int, elem_bytes: int, num_stages: int, largest: int = 64) -> int:
    """Largest power-of-two key tile in [16, largest] whose K/V stages fit `MAX_SHARED_MEMORY_BYTES`."""
    block_n = largest
    while block_n > 16 and shared_memory_bytes(
        block_n=block_n, block_d=block_d, elem_bytes=elem_bytes, num_stages=num_stages
    ) > MAX_SHARED_MEMORY_BYTES:  # fmt: skip
        block_n //= 2
    return block_n


def choose_num_warps(*, rows: int, block_n: int, block_d: int, elem_bytes: int) -> int:
    """4 warps, doubled (up to 16) while the tiles need more than `MAX_REGISTERS_PER_THREAD` per thread."""
    num_warps = 4
    while num_warps < 16 and registers_per_thread(
        rows=rows, block_n=block_n, block_d=block_d, elem_bytes=elem_bytes, num_warps=num_warps
    ) > MAX_REGISTERS_PER_THREAD:  # fmt: skip
        num_warps *= 2
    return num_warps


def store_launch_config(*, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> StoreLaunchConfig:
    """One program per token; enough warps that each thread moves about 16 bytes of each tensor."""
    block_h, block_d = next_power_of_2(num_kv_heads), next_power_of_2(head_dim)
    row_bytes = block_h * block_d * torch.empty((), dtype=dtype).element_size()
    num_warps = min(8, max(1, next_power_of_2(row_bytes // (32 * 16))))
    return StoreLaunchConfig(block_h=block_h, block_d=block_d, num_warps=num_warps)


def decode_launch_config(
    *, num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, max_context_len: int,
    dtype: torch.dtype, num_sms: int, quantized: bool = False,
) -> DecodeLaunchConfig:  # fmt: skip
    """Choose a decode launch. `max_context_len` is an upper bound known without a device sync
    (`max_blocks_per_seq * block_size`). Splits are added until the grid has ~4 programs per SM, never below
    `MIN_TILES_PER_SPLIT` tiles per split. A quantized cache gets at least 8 warps: its K/V tiles are
    dequantized in registers (4 warps took 255 registers on sm_80/sm_90 at head_dim 128)."""
    elem_bytes = torch.empty((), dtype=dtype).element_size()
    block_g = max(16, next_power_of_2(num_heads // num_kv_heads))
    block_d = max(16, next_power_of_2(head_dim))
    num_stages = 2
    largest = min(64, max(16, next_power_of_2(max_context_len)))
    block_n = choose_block_n(block_d=block_d, elem_bytes=elem_bytes, num_stages=num_stages, largest=largest)
    num_tiles = max(1, math.ceil(max_context_len / block_n))
    wanted = math.ceil(4 * num_sms / max(1, num_seqs * num_kv_heads))
    return DecodeLaunchConfig(
        block_g=block_g,
        block_n=block_n,
        block_d=block_d,
        num_splits=max(1, min(wanted, num_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS)),
        num_warps=max(choose_num_warps(rows=block_g, block_n=block_n, block_d=block_d, elem_bytes=elem_bytes),
                      8 if quantized else 4),
        num_stages=num_stages,
        dot_precision="ieee" if dtype == torch.float32 else "tf32",
        split_nibbles=INT4_SPLIT_NIBBLES,  # read at each call: tests flip it
    )


def prefill_launch_config(
    *, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, quantized: bool = False
) -> PrefillLaunchConfig:
    """Choose a prefill launch: 64 query rows per tile (e.g. 16 tokens x 4 heads, 8 tokens x 8 heads) and at
    most 32 keys per tile. Compiled for sm_80, 64 x 64 tiles of head_dim 128 on 4 warps took 255 registers and
    spilled; 64 x 32 takes 190 on sm_80 and 147 on sm_90 (scripts/gpu_compile_check.py). A quantized cache
    (dequantized in registers, plus the tail pass) spilled on sm_80 at 64 x 32, on 4 warps and on 8 (int4): it
    gets 64 x 16 tiles on 8 warps."""
    group = num_heads // num_kv_heads
    elem_bytes = torch.empty((), dtype=dtype).element_size()
    block_d = max(16, next_power_of_2(head_dim))
    block_m = max(64, next_power_of_2(group))
    num_stages = 1 if quantized else 2  # quantized: the dequant needs the registers a second stage holds
    block_n = choose_block_n(block_d=block_d, elem_bytes=elem_bytes, num_stages=num_stages,
                             largest=16 if quantized else 32)
    return PrefillLaunchConfig(
        block_m=block_m,
        block_q=block_m // group,
        block_n=block_n,
        block_d=block_d,
        num_warps=max(choose_num_warps(rows=block_m, block_n=block_n, block_d=block_d, elem_bytes=elem_bytes),
                      8 if quantized else 4),
        num_stages=num_stages,
        dot_precision="ieee" if dtype == torch.float32 else "tf32",
    )
