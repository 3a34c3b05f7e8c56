"""Head calibration (DuoAttention's idea): which KV heads attend far back, measured on sample text.

A head whose last queries put much of their attention beyond a local window (and past the attention sinks) is a
retrieval head: compressing or evicting its history hurts long-range recall. The others mostly look at sinks and
recent tokens, so they tolerate harder compression. `calibrate_retrieval_heads` returns per-layer head indices
ready for `PagedConfig(kv_full_precision_heads=...)`. `calibrate_streaming_heads` measures the other side
directly: how little the model's predictions change when one head sees only sinks + a recent window; its choice
is ready for `PagedConfig(kv_streaming_heads=...)`.

    attention of one query at position q (row of one head's map)
    | sinks | ........ far: counted ........ | window: local |q
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hf_paged.cache.attention_switch import attention_configs, use_attention
from hf_paged.compat import execution_device


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
    with use_attention(attention_configs(model), "eager"):  # only eager attention returns the maps
        total = None
        for sample in samples:
            ids = torch.tensor([list(sample)], device=execution_device(model))
            out = model(ids, output_attentions=True, use_cache=False)
            scores = retrieval_scores(out.attentions, num_kv_heads, window=window, num_sink_tokens=num_sink_tokens,
                                      num_queries=num_queries)
            total = scores if total is None else total + scores
    if total is None:
        raise ValueError("calibrate_retrieval_heads needs at least one sample; pass token id lists")
    total = total / len(samples)
    return RetrievalHeads(total, choose_heads(total, fraction))


# -- streaming heads (DuoAttention) ------------------------------------------------------------------------------
_CALIBRATION_ATTENTION = "hf_paged_streaming_calibration"


@dataclass(slots=True)
class StreamingHeads:
    """Streaming-head calibration result."""

    kl: torch.Tensor  # [num_layers, num_kv_heads] mean KL(full || that pair alone streaming) over scored positions
    streaming_heads: tuple[tuple[int, ...], ...]  # per layer, the chosen KV heads (for PagedConfig)


class _StreamingMask:
    """Eager attention where the KV heads in `heads` (a set of (layer, kv head)) see only sinks + window blocks,
    as the paged engine's streaming heads do (`hf_paged.cache.compression.streaming_heads.visible_keys`)."""

    def __init__(self, block_size: int, sink_blocks: int, window_blocks: int) -> None:
        self.block_size, self.sink_blocks, self.window_blocks = block_size, sink_blocks, window_blocks
        self.heads: set[tuple[int, int]] = set()

    def __call__(self, module, query, key, value, attention_mask, *, scaling=None, sliding_window=None, **kwargs):
        from hf_paged.cache.compression.streaming_heads import visible_keys
        from hf_paged.cache.layer_kv import layer_index

        layer = layer_index(module)
        num_heads, num_kv_heads, n = query.shape[1], key.shape[1], query.shape[2]
        group = num_heads // num_kv_heads
        pos = torch.arange(n, device=query.device)
        causal = pos[None, :] <= pos[:, None]
        if sliding_window is not None:
            causal &= pos[None, :] > pos[:, None] - sliding_window
        mask = causal.expand(num_heads, n, n).clone()
        local = causal & visible_keys(pos, pos, self.block_size, self.sink_blocks, self.window_blocks)
        for h in range(num_kv_heads):
            if (layer, h) in self.heads:
                mask[h * group : (h + 1) * group] = local
        k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        scores = torch.matmul(query, k.transpose(-1, -2)).float() * scale
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(query.dtype)
        return torch.matmul(probs, v).transpose(1, 2).contiguous(), None


@torch.no_grad()
def calibrate_streaming_heads(
    model: torch.nn.Module, samples: Sequence[Sequence[int]], *, num_streaming: int, num_sink_tokens: int = 16,
    window: int = 128, block_size: int = 16, num_positions: int = 64,
) -> StreamingHeads:
    """Choose the (layer, KV head) pairs that tolerate seeing only sinks + a recent window (DuoAttention).

    Each pair is scored alone: the mean KL divergence between the model's next-token distributions over the last
    `num_positions` positions of each sample with full attention and with only that pair restricted to the first
    `num_sink_tokens` plus the last `window` tokens (at `block_size` granularity, as the paged engine stores them).
    The `num_streaming` pairs with the smallest KL are chosen. Use samples that are not the evaluation ones, and
    long enough (well past sinks + window) for the restriction to matter.

    Args:
        model: a transformers causal LM; its attention is switched to a masked eager function (restored afterwards).
        samples: token id lists (held-out text, passkey prompts).
        num_streaming: how many pairs to make streaming (0 .. num_layers x num_kv_heads).

    Example:
        >>> heads = calibrate_streaming_heads(model, texts, num_streaming=5, num_sink_tokens=16, window=128)  # doctest: +SKIP
        >>> PagedConfig(kv_cache_dtype="int4", kv_streaming_heads=heads.streaming_heads,
        ...             enable_prefix_caching=False, num_sink_tokens=16, window_tokens=128)  # doctest: +SKIP
    """
    from transformers import AttentionInterface

    text = model.config.get_text_config(decoder=True)
    num_layers = text.num_hidden_layers
    num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if not 0 <= num_streaming <= num_layers * num_kv_heads:
        raise ValueError(f"num_streaming must be in [0, {num_layers * num_kv_heads}] (layers x KV heads), "
                         f"got {num_streaming!r}")
    if not samples:
        raise ValueError("calibrate_streaming_heads needs at least one sample; pass token id lists")
    masker = _StreamingMask(block_size, -(-num_sink_tokens // block_size), -(-window // block_size))
    AttentionInterface.register(_CALIBRATION_ATTENTION, masker)
    kl = torch.zeros(num_layers, num_kv_heads)
    with use_attention(attention_configs(model), _CALIBRATION_ATTENTION):
        device = execution_device(model)
        for sample in samples:
            ids = torch.tensor([list(sample)], device=device)
            masker.heads = set()
            base = torch.log_softmax(model(ids, use_cache=False).logits[0, -num_positions:].float(), -1)
            for layer in range(num_layers):
                for head in range(num_kv_heads):
                    masker.heads = {(layer, head)}
                    logp = torch.log_softmax(model(ids, use_cache=False).logits[0, -num_positions:].float(), -1)
                    kl[layer, head] += float((base.exp() * (base - logp)).sum(-1).mean())
    kl /= len(samples)
    return StreamingHeads(kl, choose_streaming_heads(kl, num_streaming))


def choose_streaming_heads(kl: torch.Tensor, num_streaming: int) -> tuple[tuple[int, ...], ...]:
    """The `num_streaming` (layer, KV head) pairs with the smallest KL, as per-layer sorted tuples."""
    num_layers, num_kv_heads = kl.shape
    order = torch.argsort(kl.flatten(), stable=True)[:num_streaming].tolist()
    chosen: list[list[int]] = [[] for _ in range(num_layers)]
    for flat in order:
        chosen[flat // num_kv_heads].append(flat % num_kv_heads)
    return tuple(tuple(sorted(layer)) for layer in chosen)
