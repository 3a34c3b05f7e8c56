"""Checks behind `PagedConfig.__post_init__` (`config.py`): value checks of one field, and the head-table settings'
refusals of the fields they cannot work beside. Each error names the field, the value and what is allowed. Imports
nothing of ours; takes the config duck-typed (a leaf under `config`)."""

from __future__ import annotations

from typing import Any


def check_streaming_heads(cfg: Any) -> tuple[tuple[int, ...], ...]:
    """`cfg.kv_streaming_heads` checked; returns it de-duplicated and sorted per layer."""
    heads = cfg.kv_streaming_heads
    if not is_head_table(heads):
        raise ValueError(
            "PagedConfig.kv_streaming_heads must be None or one tuple of KV head indices (ints >= 0) per layer, "
            f"e.g. ((), (1,), (0, 1)); got {heads!r}"
        )
    heads = tuple(tuple(sorted(set(layer))) for layer in heads)
    full = cfg.kv_full_precision_heads or ()
    for layer, chosen in enumerate(heads):
        overlap = sorted(set(chosen) & set(full[layer] if layer < len(full) else ()))
        if overlap:
            raise ValueError(
                f"PagedConfig.kv_streaming_heads and kv_full_precision_heads both name layer {layer} KV heads "
                f"{overlap}; allowed: disjoint sets (a head either keeps its whole history or streams)"
            )
    # Streaming heads drop the history of their blocks as the window moves on: a block shared through the
    # prefix cache, dropped again by token eviction or copied out by a swap would need that history.
    for name, value, allowed in (
        ("enable_prefix_caching", cfg.enable_prefix_caching, False),
        ("kv_pruning", cfg.kv_pruning, None),
        ("preemption_mode", cfg.preemption_mode, "recompute"),
    ):
        if value != allowed:
            raise ValueError(
                f"PagedConfig.kv_streaming_heads does not work with {name}={value!r}; allowed with streaming heads: "
                f"{name}={allowed!r} (or kv_streaming_heads=None)"
            )
    return heads


def check_head_merge(cfg: Any) -> tuple[tuple[int, ...], ...]:
    """`cfg.head_merge` checked; returns it as tuples."""
    table = cfg.head_merge
    if not is_head_table(table) or not table or any(not layer for layer in table):
        raise ValueError("PagedConfig.head_merge must be None or one tuple per layer naming each query head's "
                         f"representative query head (ints >= 0), e.g. ((0, 1, 2, 3), (0, 0, 2, 2)); got {table!r}")
    table = tuple(tuple(layer) for layer in table)
    for layer, reps in enumerate(table):
        if any(r >= len(reps) or reps[r] != r for r in reps):
            raise ValueError(f"PagedConfig.head_merge layer {layer} = {reps}: a representative must be a head of "
                             "the layer that represents itself (head_merge[layer][r] == r)")
    # Merged layers store plain blocks with fewer key heads: compressed formats, pruning's scores over every
    # key head and the disk tier's plain layout do not know them; their attention (`head_merge_attention`) is
    # dense, so sparse prefill would run as if unset.
    for name, value, allowed in (("kv_cache_dtype", cfg.kv_cache_dtype, "auto"),
                                 ("key_cache_dtype", cfg.key_cache_dtype, None),
                                 ("value_cache_dtype", cfg.value_cache_dtype, None),
                                 ("kv_full_precision_heads", cfg.kv_full_precision_heads, None),
                                 ("kv_streaming_heads", cfg.kv_streaming_heads, None),
                                 ("kv_pruning", cfg.kv_pruning, None),
                                 ("kv_offload_dir", cfg.kv_offload_dir, None),
                                 ("sparse_prefill", cfg.sparse_prefill, None)):
        if value != allowed:
            raise ValueError(f"PagedConfig.head_merge does not work with {name}={value!r}; allowed with "
                             f"head_merge: {name}={allowed!r} (or head_merge=None)")
    return table


def check_sparse_prefill(cfg: Any) -> None:
    """Sparse prefill acts on plain blocks only: quantized layers attend densely, so beside a quantized cache it
    would run as if unset (refused, as any setting that does nothing)."""
    if cfg.sparse_prefill is None or (cfg.key_dtype == "auto" and cfg.value_dtype == "auto"):
        return
    name = next((n for n in ("key_cache_dtype", "value_cache_dtype") if getattr(cfg, n) not in (None, "auto")),
                "kv_cache_dtype")
    allowed = "auto" if name == "kv_cache_dtype" else None
    raise ValueError(f"PagedConfig.sparse_prefill={cfg.sparse_prefill!r} does not work with {name}="
                     f"{getattr(cfg, name)!r} (quantized layers attend densely: it would do nothing); allowed with "
                     f"sparse_prefill: {name}={allowed!r} (or sparse_prefill=None)")


def is_head_table(heads: Any) -> bool:
    """One tuple/list of KV head indices (ints >= 0) per layer."""
    return isinstance(heads, (tuple, list)) and all(isinstance(layer, (tuple, list)) and all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in layer) for layer in heads)


def check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"PagedConfig.{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"PagedConfig.{name} must be >= {minimum}, got {value}")


def check_choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"PagedConfig.{name} must be one of {list(allowed)}, got {value!r}")
