"""`block_size="auto"`: the block size picked from the model's shape and the machine, deterministically.

The design's rule of thumb is L2 size / (2 x d_model) tokens (one block's keys and values of one layer fill the
L2 cache). Measured before adopting it (`benchmarks/block_size.py`, `benchmarks/block_size_results.md`: two model
shapes x a ragged, a shared-prefix and a multi-turn workload, block sizes 8/16/32/64 and the rule's value, CPU):

  - throughput: 8-64 all within the run-to-run noise of 16 (0.79-1.14x, with max/min CPU spreads up to 1.5x),
    no block size ahead on every shape and workload; the rule's 256 (1 MiB L2 / (2 x 256 x 4 bytes) = 512, clipped)
    no better (0.87-1.08x);
  - hit rate: the same at every block size (a partially matching block is copied, `take_partial_block`);
  - fragmentation grows with the block: 2.7% of the allocated slots unused at 8, 5.6% at 16, 20% at 64, 58% at 256
    on the ragged workload (pool memory that holds nothing).

So the data supports no rule from the shape: "auto" is 16 on every model and machine (the default; the smallest
block at which the per-block costs were not measured to grow). The rule of thumb's value is still computed and
reported (`BlockSizeChoice.rule_of_thumb`) so a later measurement (a GPU, a wider model) can revisit it. Deterministic:
it reads only the model config and the device's L2 size.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, replace

import torch

from hf_paged.cache.sizing import KVShape, kv_shape_of
from hf_paged.config import PagedConfig

_MAX_BLOCK_SIZE = 256  # PagedConfig's bound
_UNKNOWN_L2_BYTES = 1 << 20  # where the machine cannot tell: a typical per-core L2 (deterministic either way)


@dataclass(slots=True, frozen=True)
class BlockSizeChoice:
    """What `block_size="auto"` resolved to, and from what."""

    block_size: int
    l2_bytes: int  # the device's L2 cache (per core on a CPU) as read, or the fallback
    d_model: int  # the model's hidden size
    rule_of_thumb: int  # L2 / (2 x d_model x element size), a power of two in [1, 256]: reported, see the results
    reason: str  # one line: why this block size


def machine_cache_bytes(device: torch.device | str | None = None) -> int:
    """The L2 cache a block's K/V compete for: per core on a CPU (sysfs), the whole L2 on a CUDA device; the fallback
    (1 MiB) where it cannot be read. Depends only on the machine, so "auto" is deterministic for a model+machine."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        return size or _UNKNOWN_L2_BYTES
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{index}/level") as f:
                level = f.read().strip()
            with open(f"{index}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        if level == "2":
            return _parse_size(text)
    return _UNKNOWN_L2_BYTES


def _parse_size(text: str) -> int:
    """sysfs cache sizes: "1024K", "2M", "32768K"."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    return int(digits) * scale if digits.isdigit() else _UNKNOWN_L2_BYTES


def rule_of_thumb(shape: KVShape, d_model: int, dtype: torch.dtype, l2_bytes: int) -> int:
    """The design's L2 / (2 x d_model) tokens, counted in bytes of `dtype`, rounded down to a power of two, clipped
    to [1, 256]."""
    del shape  # the rule reads d_model only (not the KV heads): kept in the signature for the measured variants
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = max(1, l2_bytes // (2 * d_model * elem))
    return min(_MAX_BLOCK_SIZE, 1 << (tokens.bit_length() - 1))


def choose_block_size(model_config, dtype: torch.dtype, device=None) -> BlockSizeChoice:
    """The block size "auto" picks for this model on this machine (see the module docstring for the rule)."""
    shape = kv_shape_of(model_config)
    text = model_config.get_text_config(decoder=True) if hasattr(model_config, "get_text_config") else model_config
    d_model = int(getattr(text, "hidden_size", 0) or shape.num_kv_heads * shape.head_dim)
    l2 = machine_cache_bytes(device)
    rule = rule_of_thumb(shape, d_model, dtype, l2)
    size, reason = _measured_rule(shape, rule)
    return BlockSizeChoice(size, l2, d_model, rule, reason)


def _measured_rule(shape: KVShape, rule: int) -> tuple[int, str]:
    """What the measurements support (module docstring): 16 whatever the shape and the rule of thumb say."""
    del shape
    return 16, (f"16: 8-64 measured within noise on throughput and equal on hit rate, fragmentation grows with the "
                f"block; the L2 rule of thumb ({rule}) was not adopted (benchmarks/block_size_results.md)")


def resolve_block_size(cfg: PagedConfig, model_config, dtype: torch.dtype, device=None) -> PagedConfig:
    """`cfg` itself when its block size is a number; else a copy with the block size "auto" picks. (The engine's
    first read of its config: anything but a `PagedConfig` is a `TypeError` here.)"""
    if not isinstance(cfg, PagedConfig):
        hint = f"PagedConfig(**{cfg!r})" if isinstance(cfg, dict) else "PagedConfig(...)"
        raise TypeError(f"the engine's config must be a PagedConfig, got {type(cfg).__name__}; pass {hint}"[:300])
    if cfg.block_size != "auto":
        return cfg
    return replace(cfg, block_size=choose_block_size(model_config, dtype, device).block_size)
