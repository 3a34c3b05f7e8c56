"""Head merging (CHAI, clustered head attention): query heads whose attention is nearly the same share one score.

A merge names, per layer, the representative query head of every query head. Within a cluster (the heads that
name one representative) attention probabilities are computed once, from the representative's query and key, and
every member applies them to its own values:

    out[h] = softmax(q[rep[h]] . K[kv(rep[h])]^T * scale) @ V[kv(h)]          kv(h) = h // (heads / kv_heads)

Which keys must be stored (the GQA rule). Only representatives read keys, so a layer keeps the key head of
every KV group that holds a representative, and no other; values stay per KV head (every member reads its own).
A key head is dropped exactly when all the query heads of its group are members of clusters whose representatives
sit in other groups. With 8 query heads over 2 KV heads, a layer saves keys only if all 4 heads of one group follow
representatives of the other: 1 key head + 2 value heads = 3/4 of the layer's KV bytes. Merging heads of one group
with each other saves score computation, never bytes (they already share their key head).

    layer with heads 0..7, kv_heads 2 (group 4), representatives (0, 0, 2, 3, 0, 0, 2, 3)
    clusters {0, 1, 4, 5} -> 0   {2, 6} -> 2   {3, 7} -> 3        representatives all in group 0
    keys stored: KV head 0 only          values stored: KV heads 0 and 1

`PagedConfig(head_merge=plan.representatives)` takes the table (`calibrate_head_merge` in `head_merge_calibrate`
measures one); a layer whose every head represents itself is stored and attended as usual (`PagedLayer`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

from hf_paged.cache.sizing import KVShape, budget_bytes, max_useful_blocks
from hf_paged.config import PagedConfig
from hf_paged.errors import InvalidConfigError

__all__ = ["HeadMergePlan", "LayerMerge", "check_head_merge", "layer_merges", "merged_bytes_per_block",
           "merged_num_blocks", "merges_for_cache"]


@dataclass(frozen=True, slots=True)
class LayerMerge:
    """One layer's merge, with the indices attention needs (all derived from `representatives`)."""

    representatives: tuple[int, ...]  # per query head, the query head whose probabilities it uses
    num_kv_heads: int
    rep_heads: tuple[int, ...] = field(init=False)  # the clusters' representatives, ascending (cluster c -> head)
    cluster_of: tuple[int, ...] = field(init=False)  # per query head, the index of its cluster in `rep_heads`
    kept_kv_heads: tuple[int, ...] = field(init=False)  # KV heads whose keys are stored, ascending
    key_of_cluster: tuple[int, ...] = field(init=False)  # per cluster, its key head's index in `kept_kv_heads`

    def __post_init__(self) -> None:
        group = len(self.representatives) // self.num_kv_heads
        reps = tuple(sorted(set(self.representatives)))
        kept = tuple(sorted({r // group for r in reps}))
        object.__setattr__(self, "rep_heads", reps)
        object.__setattr__(self, "cluster_of", tuple(reps.index(r) for r in self.representatives))
        object.__setattr__(self, "kept_kv_heads", kept)
        object.__setattr__(self, "key_of_cluster", tuple(kept.index(r // group) for r in reps))

    @property
    def is_identity(self) -> bool:
        """Every head represents itself: nothing merged, nothing saved."""
        return all(r == h for h, r in enumerate(self.representatives))

    @property
    def kv_fraction(self) -> float:
        """This layer's KV bytes as a share of the unmerged layer's: (kept key heads + all value heads) / 2H."""
        return (len(self.kept_kv_heads) + self.num_kv_heads) / (2 * self.num_kv_heads)


def check_head_merge(table: tuple[tuple[int, ...], ...], *, num_layers: int, num_heads: int,
                     num_kv_heads: int) -> None:
    """Raise `InvalidConfigError` unless `table` fits a model of this shape (the structure itself is checked by
    `PagedConfig`): one row per layer, one representative per query head, each representative representing itself."""
    if len(table) != num_layers:
        raise InvalidConfigError(
            f"PagedConfig.head_merge has {len(table)} layers but the model has {num_layers}; calibrate the merge on "
            "this model (calibrate_head_merge) or pass head_merge=None"
        )
    for layer, reps in enumerate(table):
        if len(reps) != num_heads:
            raise InvalidConfigError(
                f"PagedConfig.head_merge layer {layer} names {len(reps)} query heads but the model has {num_heads} "
                "attention heads; calibrate the merge on this model or pass head_merge=None"
            )
        bad = [r for r in reps if not 0 <= r < num_heads]
        if bad:
            raise InvalidConfigError(
                f"PagedConfig.head_merge layer {layer} names query heads {bad} outside 0..{num_heads - 1}"
            )
        loose = sorted({r for r in reps if reps[r] != r})
        if loose:
            raise InvalidConfigError(
                f"PagedConfig.head_merge layer {layer}: heads {loose} are representatives of others but follow "
                "another head themselves; a representative must represent itself (table[layer][r] == r)"
            )
    if num_heads % num_kv_heads:
        raise InvalidConfigError(f"head_merge needs num_attention_heads ({num_heads}) to be a multiple of the KV "
                                 f"heads ({num_kv_heads})")


def layer_merges(table: tuple[tuple[int, ...], ...], num_kv_heads: int) -> list[LayerMerge]:
    return [LayerMerge(tuple(reps), num_kv_heads) for reps in table]


@dataclass(slots=True)
class HeadMergePlan:
    """A merge for a whole model: what `calibrate_head_merge` returns and `PagedConfig(head_merge=...)` takes
    (its `representatives`). Saved as JSON so a calibration is made once per model."""

    representatives: tuple[tuple[int, ...], ...]  # per layer, per query head, its representative query head
    num_kv_heads: int
    threshold: float | None = None  # the calibration's distance threshold (None: made by hand)
    distances: list | None = None  # per layer, the [heads x heads] calibration distances (nested lists)

    @property
    def layers(self) -> list[LayerMerge]:
        return layer_merges(self.representatives, self.num_kv_heads)

    @property
    def kv_fraction(self) -> float:
        """KV bytes of the merged cache as a share of the unmerged one (every layer the same size unmerged)."""
        layers = self.layers
        return sum(m.kv_fraction for m in layers) / len(layers)

    @property
    def num_clusters(self) -> int:
        """Score computations per token over all layers (the unmerged model computes layers x heads)."""
        return sum(len(m.rep_heads) for m in self.layers)

    @classmethod
    def identity(cls, num_layers: int, num_heads: int, num_kv_heads: int) -> HeadMergePlan:
        """Every cluster one head: attention as unmerged (the exact path)."""
        return cls(tuple(tuple(range(num_heads)) for _ in range(num_layers)), num_kv_heads)

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump({"representatives": [list(r) for r in self.representatives],
                       "num_kv_heads": self.num_kv_heads, "threshold": self.threshold,
                       "distances": self.distances}, f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> HeadMergePlan:
        with open(path) as f:
            data = json.load(f)
        return cls(tuple(tuple(int(r) for r in layer) for layer in data["representatives"]),
                   int(data["num_kv_heads"]), data.get("threshold"), data.get("distances"))


def merges_for_cache(model_config, cfg: PagedConfig) -> list[LayerMerge] | None:
    """The layers' merges of `cfg.head_merge` checked against the model (None without head merging)."""
    if cfg.head_merge is None:
        return None
    text = model_config.get_text_config(decoder=True) if hasattr(model_config, "get_text_config") else model_config
    num_heads = int(text.num_attention_heads)
    num_kv_heads = int(getattr(text, "num_key_value_heads", None) or num_heads)
    check_head_merge(cfg.head_merge, num_layers=int(text.num_hidden_layers), num_heads=num_heads,
                     num_kv_heads=num_kv_heads)
    return layer_merges(cfg.head_merge, num_kv_heads)


def merged_bytes_per_block(merges: list[LayerMerge], block_size: int, head_dim: int, dtype: torch.dtype) -> int:
    """What one block costs over every layer: each layer's kept key heads plus all its value heads."""
    elem = torch.empty((), dtype=dtype).element_size()
    return sum((len(m.kept_kv_heads) + m.num_kv_heads) * block_size * head_dim * elem for m in merges)


def merged_num_blocks(cfg: PagedConfig, kv_shape: KVShape, per_block: int, device) -> int:
    """`num_blocks` if given, else what the KV budget buys at the merged block size (the unmerged rule of
    `sizing.num_blocks_for` with `per_block`: the bytes a merge saves become blocks)."""
    if cfg.num_blocks is not None:
        return cfg.num_blocks
    blocks = budget_bytes(cfg, device) // per_block
    if cfg.max_cache_bytes is None:
        blocks = min(blocks, max_useful_blocks(cfg, kv_shape))
    if blocks < 1:
        raise InvalidConfigError(f"PagedConfig.max_cache_bytes={cfg.max_cache_bytes} is smaller than one merged "
                                 f"block ({per_block} bytes); raise it")
    return int(blocks)
