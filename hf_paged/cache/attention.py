"""The `hf_paged` attention function: each request's queries attend to its own pages.

Registered under the name "hf_paged" in transformers' `AttentionInterface`. The engine switches a wrapped model
to it only for the duration of its own packed forwards (see `hf_paged.batching.model_runner`), so a plain forward
of a wrapped model (training, scoring) keeps its stock attention and masks.

    query  [1, num_heads, T, head_dim]   packed new tokens of every request of the step
    key    [num_blocks, block_size, num_kv_heads, head_dim]   what the layer's `update` returned (`PagedLayer`: its
                                          block storage; `CompressedLayer`: the step's touched or read blocks)
    paged_metadata                        block tables, context lengths, query offsets (model kwarg)
"""

from __future__ import annotations

import torch

from hf_paged.cache.compression import split_attention
from hf_paged.cache.kernels.cpu_launch import cpu_kernel_applies, plan_cpu_attention, run_cpu_attention
from hf_paged.cache.kernels.cpu_warm import PLAIN, KernelVariant, variant_of
from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.paged_layer import PagedLayer
from hf_paged.cache.pruning import hide_positions

ATTENTION_NAME = "hf_paged"


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    paged_metadata: PagedMetadata | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if paged_metadata is None:
        raise RuntimeError(
            "the hf_paged attention ran without `paged_metadata`: it only serves the paged engine's forwards; "
            "use the model's stock attention for plain forwards"
        )
    if key.dim() != 4 or query.shape[0] != 1:
        raise RuntimeError(
            "the hf_paged attention expects packed queries [1, heads, tokens, dim] and block storage "
            f"[blocks, block_size, kv_heads, dim]; got query {tuple(query.shape)} and key {tuple(key.shape)}: the "
            "model probably calls cache.update without its attention kwargs (unsupported model)"
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, H, D]
    layer_idx = getattr(module, "layer_idx", 0)
    step = paged_metadata.plans.compressed
    stores = None if step is None else step.kernel_stores.get(layer_idx)
    reference_only = bool(paged_metadata.hidden or paged_metadata.observed)
    if stores is not None:  # compressed, read deferred: `key`/`value` are only the step's touched blocks
        if _use_kernel(paged_metadata, q, softcap, reference_only):
            out = _compressed_kernel_attention(paged_metadata, step, stores, q, key, value, scale, sliding_window)
            return out.unsqueeze(0), None
        if (_use_cpu_kernel(paged_metadata, q, key, reference_only, variant_of(stores[0].format, stores[1].format))
                and softcap is None):
            out = _compressed_cpu_attention(paged_metadata, step, stores, q, key, value, scale, sliding_window)
            return out.unsqueeze(0), None
        key, value = stores[0].read(step, key), stores[1].read(step, value)  # the torch path's read buffers
    if paged_metadata.observed:
        _record_scores(paged_metadata, layer_idx, q, key, scale)
    needs_reference = step is not None or bool(paged_metadata.hidden)
    if _use_kernel(paged_metadata, q, softcap, needs_reference):
        out = _kernel_attention(paged_metadata, q, key, value, scale, sliding_window)
        return out.unsqueeze(0), None
    if step is None and _use_cpu_kernel(paged_metadata, q, key, reference_only, PLAIN):
        return _plain_cpu_attention(paged_metadata, q, key, value, scale, sliding_window, softcap).unsqueeze(0), None
    plans = paged_metadata.plans
    if step is not None:  # compressed cache: `key`/`value` are the step's read buffers, not the block storage
        plan = step.attention_plan(q.device, sliding_window)
    else:
        plan = plans.torch.get((q.device, sliding_window))
        if plan is None:
            plan = plans.torch[q.device, sliding_window] = build_attention_plan(
                paged_metadata.block_tables_on(q.device), paged_metadata.query_start_loc,
                paged_metadata.context_lens, paged_metadata.block_size, sliding_window, in_place=True)
    if paged_metadata.hidden.get(layer_idx):  # PyramidKV: this layer does not see some kept blocks
        layer_key = (q.device, sliding_window, layer_idx)
        if layer_key not in plans.hidden:
            plans.hidden[layer_key] = hide_positions(
                plan, paged_metadata.hidden[layer_idx], paged_metadata.query_start_loc, paged_metadata.context_lens,
                paged_metadata.block_size,
            )
        plan = plans.hidden[layer_key]
    if step is not None and step.stream is not None and step.stream.layer_heads(layer_idx):
        # Streaming heads (DuoAttention) see only sinks + window; the other heads see everything.
        stream_plan = step.streaming_attention_plan(q.device, sliding_window)
        out = split_attention(step.stream.layer_heads(layer_idx), plan, stream_plan, q, key, value, scale=scale,
                              softcap=softcap)
        return out.unsqueeze(0), None
    out = run_attention_plan(plan, q, key, value, scale=scale, softcap=softcap)
    return out.unsqueeze(0), None


def attend_packed(cache, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                  scaling: float, sliding_window: int | None, metadata: PagedMetadata) -> torch.Tensor:
    """What a stock attention module does with the paged cache and "hf_paged" (`cache.update`, then
    `paged_attention_forward`), for callers holding the step's q/k/v packed as `[T, heads, dim]` (the engine's lean
    forward); returns `[T, heads, dim]`. A plain paged layer on the CPU kernels, with nothing hidden or observed,
    stores and attends directly, the very calls the general path makes there, without its layers of dispatch."""
    layer = cache.layers[module.layer_idx]
    if (type(layer) is PagedLayer and layer.is_initialized and metadata.plans.compressed is None
            and _use_cpu_kernel(metadata, query, layer.key_cache, bool(metadata.hidden or metadata.observed), PLAIN)):
        key_cache, value_cache = layer.update_packed(key, value, metadata)
        return _plain_cpu_attention(metadata, query, key_cache, value_cache, scaling, sliding_window, None)
    key, value = cache.update(key.transpose(0, 1)[None], value.transpose(0, 1)[None], module.layer_idx,
                              kwargs={"paged_metadata": metadata})
    return paged_attention_forward(module, query.transpose(0, 1)[None], key, value, None, scaling=scaling,
                                   sliding_window=sliding_window, paged_metadata=metadata)[0][0]


def _record_scores(metadata: PagedMetadata, layer_idx: int, q: torch.Tensor, key: torch.Tensor, scale: float) -> None:
    """SnapKV: how much the last prompt queries of the observed requests attend to each of their keys."""
    from hf_paged.cache.pruning import observation_scores

    step = metadata.plans.compressed  # compressed: `key` is the step's read buffer, indexed virtually
    bs, (heads, dim) = metadata.block_size, key.shape[-2:]
    flat = key.reshape(-1, heads, dim)
    for i, num_observed in metadata.observed.queries.items():
        context_len, q_end = metadata.context_lens[i], metadata.query_start_loc[i + 1]
        table = torch.tensor(step.virtual_tables[i]) if step is not None else metadata.block_tables[i].long()
        positions = torch.arange(context_len)
        slots = (table[positions // bs] * bs + positions % bs).to(key.device)
        keys = flat.index_select(0, slots)
        metadata.observed.record(i, layer_idx, observation_scores(q[q_end - num_observed : q_end], keys,
                                                                  num_observed, scale))


def _use_kernel(metadata: PagedMetadata, q: torch.Tensor, softcap, needs_reference: bool) -> bool:
    """Triton on CUDA under "auto" (and always under "triton"); the torch reference for soft-capped logits, for
    per-layer hidden blocks and SnapKV observation (no kernel variants), for compressed layers whose heads are
    split into groups of different formats (retrieval heads in full precision, streaming heads), and elsewhere.
    Compressed layers of one format run the fused-dequant kernels (`_compressed_kernel_attention`)."""
    backend = metadata.attention_backend
    if backend == "torch" or softcap is not None or needs_reference:
        return False
    return backend == "triton" or q.is_cuda


def _use_cpu_kernel(metadata: PagedMetadata, q: torch.Tensor, key: torch.Tensor, reference_only: bool,
                    variant: KernelVariant) -> bool:
    """The numba kernels (`kernels/cpu_attention`) under "auto" for fp32 on the CPU once their variant is loaded
    (`kernels/cpu_warm`: until then, and under "torch", the torch reference); the torch reference for per-layer
    hidden blocks and SnapKV observation too (no kernel variants)."""
    return (metadata.attention_backend == "auto" and not reference_only and variant in metadata.cpu_kernels
            and cpu_kernel_applies(q, key))


def _tail(metadata: PagedMetadata, step, touched_k, touched_v):
    """The step's touched blocks as the fused kernels' full-precision tail (a query reads its own block from
    there unless the query fills it: see `compression.blocks`)."""
    from hf_paged.cache.kernels import FullPrecisionTail

    device = touched_k.device
    tables = step.tail_tables.get(device)
    if tables is None:  # logical block b of span i (written this step) -> its index among the touched blocks
        bs, touched = step.block_size, {b: i for i, b in enumerate(step.touched_ids)}
        rows = torch.zeros(metadata.block_tables.shape, dtype=torch.int32)
        for i, span in enumerate(step.spans):
            for b in range(span.start // bs, -(-span.end // bs)):
                rows[i, b] = touched[span.block_ids[b]]
        tables = step.tail_tables[device] = rows.to(device)
    return FullPrecisionTail(touched_k, touched_v, tables)


def _compressed_kernel_attention(metadata: PagedMetadata, step, stores, q, touched_k, touched_v, scale,
                                 sliding_window) -> torch.Tensor:
    """Fused-dequant Triton kernels on the quantized blocks in place, the touched blocks as their tail."""
    return _kernel_attention(metadata, q, stores[0].kernel_operand(), stores[1].kernel_operand(), scale,
                             sliding_window, tail=_tail(metadata, step, touched_k, touched_v))


def _compressed_cpu_attention(metadata: PagedMetadata, step, stores, q, touched_k, touched_v, scale,
                              sliding_window) -> torch.Tensor:
    """The CPU kernels' fused dequantization, on the same operands as `_compressed_kernel_attention`."""
    plan = _cpu_plan(metadata, sliding_window, quantized=True)
    return run_cpu_attention(plan, q, stores[0].kernel_operand(), stores[1].kernel_operand(), scale=scale,
                             softcap=None, tail=_tail(metadata, step, touched_k, touched_v))


def _plain_cpu_attention(metadata: PagedMetadata, q, key_cache, value_cache, scale, sliding_window,
                         softcap) -> torch.Tensor:
    """The CPU kernels on a plain (unquantized) pool, under the step's shared plan."""
    plan = _cpu_plan(metadata, sliding_window, quantized=False)
    return run_cpu_attention(plan, q, key_cache, value_cache, scale=scale, softcap=softcap)


def _cpu_plan(metadata: PagedMetadata, sliding_window: int | None, *, quantized: bool):
    """The CPU kernels' plan of the step (one per window and cache kind), built by the first layer that needs it."""
    plan = metadata.plans.cpu.get((sliding_window, quantized))
    if plan is None:
        plan = metadata.plans.cpu[sliding_window, quantized] = plan_cpu_attention(
            metadata.block_tables, metadata.query_start_loc, metadata.context_lens, metadata.block_size,
            sliding_window, quantized=quantized)
    return plan


def _kernel_attention(metadata: PagedMetadata, q, key_cache, value_cache, scale, sliding_window,
                      tail=None) -> torch.Tensor:
    from hf_paged.cache.kernels import paged_decode_attention, paged_prefill_attention

    device = q.device
    tables = metadata.block_tables_on(device)
    context_lens = metadata.context_lens_on(device)
    backend = "triton"
    if metadata.max_query_len == 1 and q.shape[0] == metadata.num_seqs:  # all decodes: split-K decode kernel
        return paged_decode_attention(q.contiguous(), key_cache, value_cache, tables, context_lens, scale=scale,
                                      sliding_window=sliding_window, tail=tail, backend=backend)
    return paged_prefill_attention(q.contiguous(), key_cache, value_cache, tables, metadata.query_start_loc_on(device),
                                   context_lens, scale=scale, sliding_window=sliding_window, tail=tail,
                                   backend=backend)


def register() -> None:
    """Register the attention function with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
