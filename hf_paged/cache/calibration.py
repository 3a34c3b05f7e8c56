"""Retrieval-head calibration (DuoAttention's idea): which KV heads attend far back, measured on sample text.

A head whose last queries put much of their attention beyond a local window (and past the attention sinks) is a
retrieval head: compressing or evicting its history hurts long-range recall. The others mostly look at sinks and
recent tokens, so they tolerate harder compression. `calibrate_retrieval_heads` returns per-layer head indices
ready for `PagedConfig(kv_full_precision_heads=...)`.

    attention of one query at position q (row of one head's map)
    | sinks | ........ far: counted ........ | window: local |q
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class RetrievalHeads:
    """Calibration result."""

    scores: torch.Tensor  # [num_layers, num_kv_heads] mean attention mass beyond the window (sinks excluded)
    full_precision_heads: tuple[tuple[int, ...], ...]  # per layer, the chosen KV heads (for PagedConfig)


def retrieval_scores(attentions: Sequence[torch.Tensor], num_kv_heads: int, *, window: int, num_sink_tokens: int,
                     num_queries: int) -> torch.Tensor:
    """Far-attention mass per KV head from per-layer attention maps `[batch, heads, q_len, k_len]` (causal, the
    queries being the last `q_len` positions). Query heads sharing a KV head (GQA) are averaged.

    Returns:
        `[num_layers, num_kv_heads]` float32: mean over the last `num_queries` queries (and the batch) of the
        probability mass on keys at positions `num_sink_tokens <= k < q - window`.
    """
    rows = []
    for attn in attentions:
        _, heads, q_len, k_len = attn.shape
        n = min(num_queries, q_len)
        query_pos = torch.arange(k_len - n, k_len)[:, None]
        keys = torch.arange(k_len)[None, :]
        far = (keys >= num_sink_tokens) & (keys < query_pos - window)  # [n, k_len]
        mass = (attn[:, :, -n:, :].float() * far).sum(-1).mean(dim=(0, 2))  # [heads]
        rows.append(mass.view(num_kv_heads, heads // num_kv_heads).mean(-1))
    return torch.stack(rows)


def choose_heads(scores: torch.Tensor, fraction: float) -> tuple[tuple[int, ...], ...]:
    """The top `fraction` of all (layer, KV head) pairs by score (at least one), as per-layer sorted tuples."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    num_layers, num_heads = scores.shape
    count = max(1, round(fraction * scores.numel()))
    order = torch.argsort(scores.flatten(), descending=True, stable=True)[:count].tolist()
    chosen: list[list[int]] = [[] for _ in range(num_layers)]
    for flat in order:
        chosen[flat // num_heads].append(flat % num_heads)
    return tuple(tuple(sorted(layer)) for layer in chosen)


@torch.no_grad()
def calibrate_retrieval_heads(
    model: torch.nn.Module, samples: Sequence[Sequence[int]], *, fraction: float = 0.25, window: int = 64,
    num_sink_tokens: int = 4, num_queries: int = 32,
) -> RetrievalHeads:
    """Measure retrieval heads of `model` on token-id `samples` (e.g. passkey prompts or long held-out text).

    Args:
        model: a transformers causal LM; run once per sample with eager attention (restored afterwards).
        samples: token id lists, each longer than `window + num_sink_tokens` to measure anything.
        fraction: share of all (layer, KV head) pairs to keep in full precision.
        window, num_sink_tokens, num_queries: see `retrieval_scores`.

    Example:
        >>> heads = calibrate_retrieval_heads(model, [ex.prompt_ids for ex in examples])      # doctest: +SKIP
        >>> PagedConfig(kv_cache_dtype="int4", kv_full_precision_heads=heads.full_precision_heads)  # doctest: +SKIP
    """
    text = model.config.get_text_config(decoder=True)
    num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    configs = {id(model.config): model.config}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            configs[id(config)] = config
    saved = [(c, c._attn_implementation_internal) for c in configs.values()]
    for config, _ in saved:
        config._attn_implementation_internal = "eager"  # only eager attention returns the maps
    try:
        total = None
        for sample in samples:
            ids = torch.tensor([list(sample)], device=next(model.parameters()).device)
            out = model(ids, output_attentions=True, use_cache=False)
            scores = retrieval_scores(out.attentions, num_kv_heads, window=window, num_sink_tokens=num_sink_tokens,
                                      num_queries=num_queries)
            total = scores if total is None else total + scores
    finally:
        for config, value in saved:
            config._attn_implementation_internal = value
    if total is None:
        raise ValueError("calibrate_retrieval_heads needs at least one sample; pass token id lists")
    total = total / len(samples)
    return RetrievalHeads(total, choose_heads(total, fraction))
