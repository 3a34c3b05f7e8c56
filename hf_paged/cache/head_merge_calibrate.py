"""Calibrating a head merge (CHAI): which query heads attend alike, measured on sample text.

1. Distances. Each sample runs once with eager attention, returning every layer's maps `[heads, T, T]`. Two heads'
   distance is the total variation between their probability rows, 0.5 * sum_k |p_h(k) - p_g(k)|, averaged over
   the query positions from `skip` on (the first rows see a handful of keys and agree trivially) and the samples.
   It is in [0, 1] and bounds what a merge changes: member h's output moves by at most 2 * TV * max |v|.
2. Which key heads to drop (the GQA rule of `head_merge`: only representatives read keys). Per layer, starting from
   every KV head kept, a KV group is dropped while each query head of the dropped groups has a head of a kept group
   within `threshold`; each round drops the group whose heads are closest to what stays (greedy: exact for 2 KV
   heads, a heuristic beyond).
3. Clusters. Representatives are picked among the heads of kept groups, greedily by how many not-yet-covered heads
   they reach (set cover), and every head follows its nearest representative. A head of a dropped group may follow
   one within `threshold`; a head of a kept group within `score_threshold` (None: `threshold`). Merging heads of a
   kept group saves score computations, never bytes, and adds error: `score_threshold=0` merges there only heads
   whose maps are identical (exact), keeping the KV saving of `threshold` without that extra error.

    threshold 0: only heads with identical maps merge (exact)      threshold 1: one representative per layer
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hf_paged.cache.attention_switch import attention_configs, use_attention
from hf_paged.cache.head_merge import HeadMergePlan
from hf_paged.compat import execution_device

__all__ = ["calibrate_head_merge", "choose_layer_merge", "head_distances", "measure_head_distances",
           "plan_from_distances"]


def head_distances(attn: torch.Tensor, skip: int = 8) -> torch.Tensor:
    """`[heads, heads]` mean total-variation distance between the heads' rows of one layer's maps
    `[batch, heads, T, T]`, over query positions `skip` .. T - 1 (all of them when T <= skip)."""
    rows = attn[:, :, skip:] if attn.shape[2] > skip else attn
    rows = rows.float().transpose(0, 1).reshape(attn.shape[1], -1, attn.shape[-1])  # [heads, batch * q, T]
    return torch.stack([0.5 * (rows[h][None] - rows).abs().sum(-1).mean(-1) for h in range(rows.shape[0])])


@torch.no_grad()
def measure_head_distances(model: torch.nn.Module, samples: Sequence[Sequence[int]], *,
                           skip: int = 8) -> torch.Tensor:
    """`[layers, heads, heads]` head distances of `model` averaged over token-id `samples` (one eager forward
    each; the model's attention is restored afterwards)."""
    if not samples:
        raise ValueError("calibrate_head_merge needs at least one sample; pass token id lists")
    total = None
    device = execution_device(model)
    with use_attention(attention_configs(model), "eager"):  # only eager attention returns the maps
        for sample in samples:
            out = model(torch.tensor([list(sample)], device=device), output_attentions=True, use_cache=False)
            d = torch.stack([head_distances(a.cpu(), skip) for a in out.attentions])
            total = d if total is None else total + d
    return total / len(samples)


def choose_layer_merge(d: torch.Tensor, num_kv_heads: int, threshold: float, *,
                       score_threshold: float | None = None) -> tuple[int, ...]:
    """One layer's representatives from its `[heads, heads]` distances (module doc, steps 2 and 3)."""
    num_heads = d.shape[0]
    group = num_heads // num_kv_heads

    def heads_of(groups) -> list[int]:
        return [h for g in sorted(groups) for h in range(g * group, (g + 1) * group)]

    def cost(kept: set[int]) -> float | None:
        """Sum of each dropped head's distance to its nearest kept head; None when one is beyond `threshold`."""
        candidates = heads_of(kept)
        total = 0.0
        for h in heads_of(set(range(num_kv_heads)) - kept):
            nearest = float(d[h, candidates].min())
            if nearest > threshold:
                return None
            total += nearest
        return total

    kept = set(range(num_kv_heads))
    while len(kept) > 1:
        options = [(c, -g) for g in sorted(kept) if (c := cost(kept - {g})) is not None]
        if not options:
            break
        kept.discard(-min(options)[1])  # the cheapest drop; on a tie the later group (low heads represent)
    candidates = heads_of(kept)
    within = threshold if score_threshold is None else score_threshold
    limit = [threshold if h // group not in kept else within for h in range(num_heads)]  # how far h may follow
    reps: list[int] = []
    uncovered = set(range(num_heads))
    while uncovered:  # greedy set cover: the candidate reaching most uncovered heads within their limits
        best = max((r for r in candidates if r not in reps), key=lambda r, left=frozenset(uncovered): _reach(
            d, r, left, limit))
        reps.append(best)
        uncovered -= {h for h in uncovered if float(d[h, best]) <= limit[h]}
    chosen = sorted(reps)
    return tuple(h if h in chosen else min((r for r in chosen if float(d[h, r]) <= limit[h]),
                                           key=lambda r: (float(d[h, r]), r)) for h in range(num_heads))


def _reach(d: torch.Tensor, r: int, uncovered: frozenset[int], limit: list[float]) -> tuple[int, float, int]:
    """How well `r` covers the uncovered heads: how many within their limits, then the smaller total distance,
    then the lower head."""
    near = [h for h in uncovered if float(d[h, r]) <= limit[h]]
    return len(near), -sum(float(d[h, r]) for h in near), -r


def plan_from_distances(distances: torch.Tensor, num_kv_heads: int, threshold: float, *,
                        score_threshold: float | None = None) -> HeadMergePlan:
    """A whole model's merge from `[layers, heads, heads]` distances (`measure_head_distances`)."""
    for name, value in (("threshold", threshold), ("score_threshold", 0 if score_threshold is None else score_threshold)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} is a total-variation distance in [0, 1], got {value!r}")
    if distances.dim() != 3 or distances.shape[1] != distances.shape[2] or distances.shape[1] % num_kv_heads:
        raise ValueError(f"distances must be [layers, heads, heads] with heads a multiple of num_kv_heads "
                         f"({num_kv_heads}); got {tuple(distances.shape)}")
    table = tuple(choose_layer_merge(d, num_kv_heads, threshold, score_threshold=score_threshold)
                  for d in distances)
    return HeadMergePlan(table, num_kv_heads, threshold, distances.tolist())


def calibrate_head_merge(model: torch.nn.Module, samples: Sequence[Sequence[int]], *, threshold: float,
                         skip: int = 8, score_threshold: float | None = None) -> HeadMergePlan:
    """Measure which heads of `model` attend alike on token-id `samples` and merge those within `threshold`.

    Use samples that are not the evaluation ones. The result's `representatives` go to `PagedConfig(head_merge=)`;
    `kv_fraction` says what share of the KV bytes remains, `save`/`load` keep it beside the model.

    Example:
        >>> plan = calibrate_head_merge(model, [tok(t).input_ids for t in texts], threshold=0.1)  # doctest: +SKIP
        >>> engine = Engine(model, PagedConfig(head_merge=plan.representatives))                 # doctest: +SKIP
    """
    text = model.config.get_text_config(decoder=True)
    num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    distances = measure_head_distances(model, samples, skip=skip)
    return plan_from_distances(distances, int(num_kv_heads), threshold, score_threshold=score_threshold)
