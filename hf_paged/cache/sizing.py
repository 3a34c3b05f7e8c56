"""How big a block is, how many blocks a budget buys, and the message when they run out."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from hf_paged.cache.compression.key_frame import rope_frequencies
from hf_paged.config import PagedConfig
from hf_paged.errors import InvalidConfigError, OutOfBlocksError


@dataclass(slots=True, frozen=True)
class KVShape:
    """What one token costs in every layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_model_len: int  # the model's maximum positions (for default sizing and prompt checks)
    rope_frequencies: tuple[float, ...] = ()  # RoPE inverse frequencies (`key_frame`); () when the config has none

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * elem


def long_rope_limit(config) -> int | None:
    """`original_max_position_embeddings` of a LongRoPE model (Phi-3 128k), else None. Past it the model rotates
    every position with its long factors, and stock `generate` recomputes the whole sequence when it crosses (its
    cache was rotated with the short ones): kept blocks cannot follow that, so the engine serves sequences up to it
    and `generate` runs longer ones on stock."""
    text, params, kind = _rope(config)
    if kind != "longrope":
        return None
    short = params.get("original_max_position_embeddings") or getattr(text, "original_max_position_embeddings", None)
    return int(short) if short else None


def _rope(config) -> tuple:
    """(the decoder's config, its rotary parameters (a dict, or None), their type name or None)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if not isinstance(params, dict):
        return text, None, None
    return text, params, params.get("rope_type", params.get("type"))


def length_dependent_rope(config) -> str | None:
    """The name of a rotary scheme whose frequencies change once a sequence passes the model's positions (stock
    rotates what follows with other frequencies), else None: LongRoPE (Phi-3 128k) and dynamic NTK scaling."""
    return {"longrope": "LongRoPE", "dynamic": "dynamic NTK"}.get(_rope(config)[2])


def windowed_attention(config) -> bool:
    """Whether some layer of the model attends a sliding window or chunk of positions (config-level, erring towards
    yes): such a window counts the masked slots of a padded row, where the engine keeps real tokens only."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if "sliding_attention" in (getattr(text, "layer_types", None) or ()) or getattr(text, "attention_chunk_size", None):
        return True
    if getattr(text, "window_size", None) or "local" in str(getattr(text, "attention_layers", "")):
        return True  # GPT-Neo's local layers
    return bool(getattr(text, "sliding_window", None)) and getattr(text, "use_sliding_window", True) is not False


def kv_shape_of(config) -> KVShape:
    """Read layer count, KV heads and head size from a transformers config (decoder part)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    num_layers = getattr(text, "num_hidden_layers", None)
    num_heads = getattr(text, "num_attention_heads", None)
    hidden = getattr(text, "hidden_size", None)
    if not num_layers or not num_heads or not hidden:
        raise ValueError(
            f"cannot read num_hidden_layers / num_attention_heads / hidden_size from {type(config).__name__}"
        )
    num_kv_heads = getattr(text, "num_key_value_heads", None) or num_heads
    head_dim = getattr(text, "head_dim", None) or hidden // num_heads
    max_len = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None) or 1 << 20
    short = long_rope_limit(config)
    if short is not None:  # keys of a LongRoPE model change past it: the engine serves up to it (see below)
        max_len = min(max_len, short)
    return KVShape(int(num_layers), int(num_kv_heads), int(head_dim), int(max_len), rope_frequencies(config))


def num_blocks_for(cfg: PagedConfig, shape: KVShape, dtype: torch.dtype, device=None) -> int:
    """`num_blocks` if given, else what `max_cache_bytes` buys, else what the default budget (`memory_fraction`
    of the free memory) buys, capped at what `max_num_seqs` sequences of the model's maximum length could use (so
    a tiny model never reserves gigabytes). An explicit `max_cache_bytes` is taken as asked, uncapped."""
    if cfg.num_blocks is not None:
        return cfg.num_blocks
    per_block = shape.bytes_per_block(cfg.block_size, dtype)
    budget = cfg.max_cache_bytes
    if budget is None:
        return max(1, min(budget_bytes(cfg, device) // per_block, max_useful_blocks(cfg, shape)))
    blocks = budget // per_block
    if blocks < 1:
        raise InvalidConfigError(
            f"PagedConfig.max_cache_bytes={budget} is smaller than one block ({per_block} bytes); raise it"
        )
    return blocks


def budget_bytes(cfg: PagedConfig, device=None) -> int:
    """The KV memory budget: `max_cache_bytes`, or `memory_fraction` of the device's free memory."""
    return cfg.max_cache_bytes if cfg.max_cache_bytes is not None else _default_budget(cfg, device)


def max_useful_blocks(cfg: PagedConfig, shape: KVShape) -> int:
    """Blocks that `max_num_seqs` sequences of the model's maximum length could use (the default budget's cap)."""
    return cfg.max_num_seqs * -(-shape.max_model_len // cfg.block_size)


def _default_budget(cfg: PagedConfig, device) -> int:
    """`memory_fraction` of the memory free now (after the weights were loaded) on the pool's device."""
    free = device_memory(device).free
    return int((free if free is not None else _UNKNOWN_FREE_BYTES) * cfg.memory_fraction)


_UNKNOWN_FREE_BYTES = 4 << 30  # what the default budget assumes is free where the device cannot tell


@dataclass(slots=True, frozen=True)
class DeviceMemory:
    """A device's memory in bytes; None where it cannot tell."""

    free: int | None  # free now: MemAvailable of /proc/meminfo on the CPU, the CUDA driver's free bytes
    total: int | None  # in all: physical RAM on the CPU, the GPU's memory


def device_memory(device=None) -> DeviceMemory:
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(device)
        return DeviceMemory(int(free), int(total))
    if device.type != "cpu":
        return DeviceMemory(None, None)
    free = total = None
    try:
        with open("/proc/meminfo") as f:
            free = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        pass
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    return DeviceMemory(free, total)


def check_fits_device(cfg: PagedConfig, num_blocks: int, bytes_per_block: int, device=None) -> None:
    """Refuse a pool larger than the device's whole memory before anything is allocated (a typo such as
    `max_cache_bytes=10**15` must be a clear error, not a MemoryError deep in the pool's bookkeeping)."""
    total = device_memory(device).total
    asked = num_blocks * bytes_per_block
    if total is None or asked <= total:
        return
    field = (f"num_blocks={cfg.num_blocks}" if cfg.num_blocks is not None
             else f"max_cache_bytes={cfg.max_cache_bytes}")
    raise InvalidConfigError(
        f"PagedConfig.{field} asks for {asked} bytes of KV cache ({num_blocks} blocks of {bytes_per_block} bytes) "
        f"but the device has {total} bytes of memory in all; lower {field.split('=')[0]}"
    )


def out_of_blocks(needed: int, free: int, total: int, block_size: int) -> OutOfBlocksError:
    return OutOfBlocksError(
        f"need {needed} blocks of {block_size} tokens, {free} of {total} free: raise PagedConfig.num_blocks "
        "(or max_cache_bytes), or lower the batch size / max_num_seqs / max_new_tokens"
    )
