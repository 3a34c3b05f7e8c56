"""The step's attention backend: one object chosen once per step, called by the attention of every layer.

    choose_backend(metadata, layers, device)   once per step, by the model runner, before the forward
      "torch"                                   TorchBackend      each sequence's blocks gathered, then SDPA
      "triton", or "auto" on CUDA               TritonBackend     split-K decode / causal prefill kernels in place
      "auto" elsewhere                          CpuKernelBackend  numba kernels in place (fp32 on the CPU)
    backend.forward(layer_idx, q, key, value)  per layer: the layer stores the step's K/V (`update_packed`) and
                                                returns a typed `LayerKV`; the backend attends over it
      PlainBlocks       -> attend_plain         the block storage, through the step's block tables
      CompressedBlocks  -> attend_compressed    quantized blocks in place + the touched blocks as their tail, or
                                                the read buffers through the plan's virtual tables (torch)
      MergedBlocks      -> run_merged_plan      head_merge: scores once per cluster over the plain plan (torch)

As in vLLM v1, the implementation's forward writes the layer's cache, then attends, under metadata built once per
step; the engine's `cache.update` only hands the new K/V through (`block_layer`). The kernel backends derive from
the torch backend and fall back to it, per layer, for what their kernels do not serve, each case named in their
`attend_*`: soft-capped logits (except the plain CPU kernel), PyramidKV's hidden blocks (`metadata.hidden`), SnapKV
observation (`metadata.observed`: the CPU kernels and every compressed kernel), compressed layers the fused kernels
cannot read (head groups, streaming heads, keys in the RoPE frame), a CPU variant not loaded when the step was built
(`metadata.cpu_kernels`), and queries the CPU kernels do not take (not fp32 on the CPU). The backend also keeps the
step's plans, each built by the first layer that needs it: torch gather plans (device, window), CPU kernel plans
(window, quantized), PyramidKV's per-layer plans, the fused kernels' tail tables (device).

Sparse prefill (`PagedConfig.sparse_prefill`, `cache/sparse_prefill.py`): over plain blocks, with no window, soft
cap, hidden blocks or observation, the step's long prefill chunks (`SparsePrefill.applies`) are left out of the dense
plans and attended block-sparsely on the torch path, whatever the backend (the Triton backend hands such steps to the
torch one); quantized KV and head_merge are refused beside it (`config_checks`). The sequences attended so are named in the step's
`metadata.sparse_rows`: the engine keeps their K/V out of the prefix cache (only a dense prefill's K/V are shared).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

import torch

from hf_paged.cache.compression import split_attention
from hf_paged.cache.head_merge_attention import run_merged_plan
from hf_paged.cache.kernels.cpu_launch import cpu_kernel_applies, plan_cpu_attention, run_cpu_attention
from hf_paged.cache.kernels.cpu_warm import PLAIN, variant_of
from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan
from hf_paged.cache.layer_kv import CompressedBlocks, LayerKV, MergedBlocks, PlainBlocks
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.pruning import hide_positions
from hf_paged.cache.sparse_prefill import SparsePrefill, attend_sparse_groups

if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.cache.block_layer import BlockLayer
    from hf_paged.cache.kernels import FullPrecisionTail
    from hf_paged.cache.kernels.cpu_launch import CpuAttentionPlan
    from hf_paged.cache.kernels.reference import AttentionPlan

__all__ = ["CpuKernelBackend", "TorchBackend", "TritonBackend", "choose_backend"]


def choose_backend(metadata: PagedMetadata, layers: Sequence[BlockLayer], device: torch.device,
                   sparse: SparsePrefill | None = None) -> TorchBackend:
    """The step's backend from `PagedConfig.attention_backend` and the device the forward runs on; `sparse`: the
    engine's sparse prefill settings (`SparsePrefill.from_config`), None for dense prefill."""
    name = metadata.attention_backend
    if name == "torch":
        return TorchBackend(metadata, layers, sparse)
    if name == "triton" or device.type == "cuda":
        return TritonBackend(metadata, layers, sparse)
    if name == "auto":
        return CpuKernelBackend(metadata, layers, sparse)
    raise ValueError(f"attention_backend must be 'auto', 'torch' or 'triton'; got {name!r}")


class TorchBackend:
    """The torch reference: each sequence's blocks gathered (or sliced in place), then SDPA (`kernels.reference`).
    Serves everything: per-layer hidden blocks, SnapKV observation, streaming heads, soft-capped logits."""

    name: ClassVar[str] = "torch"
    __slots__ = ("_cpu_plans", "_hidden_plans", "_sparse_plans", "_sparse_seqs", "_tails", "_torch_plans", "layers",
                 "metadata", "sparse")

    def __init__(self, metadata: PagedMetadata, layers: Sequence[BlockLayer],
                 sparse: SparsePrefill | None = None) -> None:
        self.metadata = metadata
        self.layers = layers  # the cache's layers, by layer index
        self.sparse = sparse
        # per sequence: is its chunk attended sparsely this step (None: not decided yet; [] when sparse is off)
        self._sparse_seqs: list[bool] | None = None if sparse is not None else []
        # (device, which) -> torch plan (no window) of the sparse chunks ("sparse": their slots and rows) or of the
        # other sequences ("dense"; "long": the other long chunks only, the CPU kernels attend the short ones)
        self._sparse_plans: dict[tuple[torch.device, str], AttentionPlan] = {}
        self._torch_plans: dict[tuple[torch.device, int | None], AttentionPlan] = {}
        self._hidden_plans: dict[tuple[torch.device, int | None, int], AttentionPlan] = {}  # + layer
        self._cpu_plans: dict[tuple[int | None, bool], CpuAttentionPlan] = {}  # (window, quantized)
        self._tails: dict[torch.device, torch.Tensor] = {}  # the fused kernels' tail block tables

    def forward(self, layer_idx: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float,
                sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        """Store the layer's new K/V `[T, kv_heads, D]` and attend: q `[T, heads, D]` -> `[T, heads, D]`."""
        kv: LayerKV = self.layers[layer_idx].update_packed(key, value, self.metadata)
        match kv:
            case PlainBlocks():
                return self.attend_plain(layer_idx, kv, q, scale, sliding_window, softcap)
            case CompressedBlocks():
                return self.attend_compressed(layer_idx, kv, q, scale, sliding_window, softcap)
            case MergedBlocks():  # head_merge: scores once per cluster (torch, every backend)
                return run_merged_plan(self.plain_plan(layer_idx, q.device, sliding_window), kv.indices, q,
                                       kv.keys, kv.values, scale=scale, softcap=softcap)
        raise TypeError(f"layer {layer_idx} returned {type(kv).__name__}; a layer's update_packed returns a LayerKV")

    def attend_plain(self, layer_idx: int, kv: PlainBlocks, q: torch.Tensor, scale: float,
                     sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        if self.metadata.observed:
            self._record_scores(layer_idx, q, kv.keys, None, scale)
        sparse = self.sparse_seqs(sliding_window, softcap)
        if any(sparse):
            out = run_attention_plan(self._sparse_plan(q.device, "dense", sparse), q, kv.keys, kv.values, scale=scale)
            self._attend_sparse(q, kv, scale, out)
            return out
        plan = self.plain_plan(layer_idx, q.device, sliding_window)
        return run_attention_plan(plan, q, kv.keys, kv.values, scale=scale, softcap=softcap)

    def sparse_seqs(self, sliding_window: int | None, softcap: float | None) -> list[bool]:
        """Per sequence, whether its chunk is attended block-sparsely in this layer ([] or all False: none).
        Decided once per step from the chunk lengths; a window, a soft cap, hidden blocks or observation keep the
        layer dense."""
        m = self.metadata
        if self.sparse is None or sliding_window is not None or softcap is not None or m.hidden or m.observed:
            return []
        if self._sparse_seqs is None:
            qsl = m.query_start_loc
            self._sparse_seqs = [self.sparse.applies(qsl[i + 1] - qsl[i], c) for i, c in enumerate(m.context_lens)]
            m.sparse_rows.update(i for i, s in enumerate(self._sparse_seqs) if s)  # (their K/V are not a prefix's)
        return self._sparse_seqs

    def _sparse_plan(self, device: torch.device, which: str, skip: list[bool]) -> AttentionPlan:
        """The step's torch plan (no window) of the sequences not in `skip`, built once per `which`."""
        plan = self._sparse_plans.get((device, which))
        if plan is None:
            m = self.metadata
            plan = self._sparse_plans[device, which] = build_attention_plan(
                m.block_tables_on(device), m.query_start_loc, m.context_lens, m.block_size, skip=skip, in_place=True)
        return plan

    def _attend_sparse(self, q: torch.Tensor, kv: PlainBlocks, scale: float, out: torch.Tensor) -> None:
        """The sparse chunks' rows of `out` (`sparse_prefill.attend_sparse_groups`)."""
        chunks = self._sparse_plan(q.device, "sparse", [not s for s in self._sparse_seqs])
        attend_sparse_groups(self.sparse, chunks.prefills, q, kv.keys, kv.values, scale=scale, out=out)

    def plain_plan(self, layer_idx: int, device: torch.device, sliding_window: int | None) -> AttentionPlan:
        """The torch plan over the block storage in place (built once per step), with this layer's hidden blocks."""
        plan = self._torch_plans.get((device, sliding_window))
        if plan is None:
            m = self.metadata
            plan = self._torch_plans[device, sliding_window] = build_attention_plan(
                m.block_tables_on(device), m.query_start_loc, m.context_lens, m.block_size, sliding_window,
                in_place=True)
        return self._hidden(layer_idx, plan, device, sliding_window)

    def attend_compressed(self, layer_idx: int, kv: CompressedBlocks, q: torch.Tensor, scale: float,
                          sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        """Over the read buffers (full blocks dequantized, then the touched ones), indexed virtually."""
        keys, values = kv.read()
        if self.metadata.observed:
            self._record_scores(layer_idx, q, keys, kv.plan.virtual_tables, scale)
        plan = self._hidden(layer_idx, kv.plan.attention_plan(q.device, sliding_window), q.device, sliding_window)
        if kv.streaming_heads:  # DuoAttention: these heads see only sinks + window; the others see everything
            stream_plan = kv.plan.streaming_attention_plan(q.device, sliding_window)
            return split_attention(kv.streaming_heads, plan, stream_plan, q, keys, values, scale=scale,
                                   softcap=softcap)
        return run_attention_plan(plan, q, keys, values, scale=scale, softcap=softcap)

    def _hidden(self, layer_idx: int, plan: AttentionPlan, device: torch.device,
                sliding_window: int | None) -> AttentionPlan:
        """PyramidKV: `plan` with the blocks this layer must not see masked (the plan itself for other layers)."""
        m = self.metadata
        if not m.hidden.get(layer_idx):
            return plan
        key = (device, sliding_window, layer_idx)
        if key not in self._hidden_plans:
            self._hidden_plans[key] = hide_positions(plan, m.hidden[layer_idx], m.query_start_loc, m.context_lens,
                                                     m.block_size)
        return self._hidden_plans[key]

    def _record_scores(self, layer_idx: int, q: torch.Tensor, key: torch.Tensor,
                       virtual_tables: list[list[int]] | None, scale: float) -> None:
        """SnapKV: how much the last prompt queries of the observed requests attend to each of their keys. `key`:
        the block storage (`virtual_tables` None) or a compressed step's read buffer (indexed virtually)."""
        from hf_paged.cache.pruning import observation_scores

        m = self.metadata
        bs, (heads, dim) = m.block_size, key.shape[-2:]
        flat = key.reshape(-1, heads, dim)
        for i, num_observed in m.observed.queries.items():
            context_len, q_end = m.context_lens[i], m.query_start_loc[i + 1]
            table = torch.tensor(virtual_tables[i]) if virtual_tables is not None else m.block_tables[i].long()
            positions = torch.arange(context_len)
            slots = (table[positions // bs] * bs + positions % bs).to(key.device)
            keys = flat.index_select(0, slots)
            m.observed.record(i, layer_idx, observation_scores(q[q_end - num_observed : q_end], keys,
                                                               num_observed, scale))

    def _tail(self, kv: CompressedBlocks) -> FullPrecisionTail:
        """The step's touched blocks as the fused kernels' full-precision tail (a query reads its own block from
        there unless the query fills it: see `compression.blocks`)."""
        from hf_paged.cache.kernels import FullPrecisionTail

        device, step = kv.touched_keys.device, kv.plan
        tables = self._tails.get(device)
        if tables is None:  # logical block b of span i (written this step) -> its index among the touched blocks
            bs, touched = step.block_size, {b: i for i, b in enumerate(step.touched_ids)}
            rows = torch.zeros(self.metadata.block_tables.shape, dtype=torch.int32)
            for i, span in enumerate(step.spans):
                for b in range(span.start // bs, -(-span.end // bs)):
                    rows[i, b] = touched[span.block_ids[b]]
            tables = self._tails[device] = rows.to(device)
        return FullPrecisionTail(kv.touched_keys, kv.touched_values, tables)


class CpuKernelBackend(TorchBackend):
    """The numba kernels (`kernels/cpu_attention`, `cpu_quantized`) reading the pool in place: fp32 on the CPU,
    once the variant a layer calls was loaded when the step was built (`kernels/cpu_warm`)."""

    name: ClassVar[str] = "cpu"
    __slots__ = ()

    def attend_plain(self, layer_idx: int, kv: PlainBlocks, q: torch.Tensor, scale: float,
                     sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        m = self.metadata
        if m.hidden or m.observed or PLAIN not in m.cpu_kernels or not cpu_kernel_applies(q, kv.keys):
            return super().attend_plain(layer_idx, kv, q, scale, sliding_window, softcap)
        sparse = self.sparse_seqs(sliding_window, softcap)
        if not any(sparse):
            return run_cpu_attention(self._cpu_plan(sliding_window, quantized=False), q, kv.keys, kv.values,
                                     scale=scale, softcap=softcap)
        # the kernel takes the short chunks and decodes, the dense torch plan the other long chunks
        plan = self._cpu_plan(None, quantized=False)
        skip = [i not in plan.long_seqs or s for i, s in enumerate(sparse)]
        plan = replace(plan, long=self._sparse_plan(q.device, "long", skip), long_seqs=[])
        out = run_cpu_attention(plan, q, kv.keys, kv.values, scale=scale, softcap=None)
        self._attend_sparse(q, kv, scale, out)
        return out

    def attend_compressed(self, layer_idx: int, kv: CompressedBlocks, q: torch.Tensor, scale: float,
                          sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        m, (keys, values) = self.metadata, kv.stores
        if (softcap is not None or m.hidden or m.observed or not kv.kernel_readable
                or variant_of(keys.format, values.format) not in m.cpu_kernels
                or not cpu_kernel_applies(q, kv.touched_keys)):
            return super().attend_compressed(layer_idx, kv, q, scale, sliding_window, softcap)
        return run_cpu_attention(self._cpu_plan(sliding_window, quantized=True), q, keys.kernel_operand(),
                                 values.kernel_operand(), scale=scale, softcap=None, tail=self._tail(kv))

    def _cpu_plan(self, sliding_window: int | None, *, quantized: bool) -> CpuAttentionPlan:
        plan = self._cpu_plans.get((sliding_window, quantized))
        if plan is None:
            m = self.metadata
            plan = self._cpu_plans[sliding_window, quantized] = plan_cpu_attention(
                m.block_tables, m.query_start_loc, m.context_lens, m.block_size, sliding_window, quantized=quantized)
        return plan


class TritonBackend(TorchBackend):
    """The Triton kernels (`kernels/triton_decode`, `triton_prefill`): split-K decode when every sequence decodes
    one token, the causal prefill kernel otherwise; plain blocks, or quantized ones dequantized in the kernel."""

    name: ClassVar[str] = "triton"
    __slots__ = ()

    def attend_plain(self, layer_idx: int, kv: PlainBlocks, q: torch.Tensor, scale: float,
                     sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        m = self.metadata
        if softcap is not None or m.hidden or any(self.sparse_seqs(sliding_window, softcap)):
            return super().attend_plain(layer_idx, kv, q, scale, sliding_window, softcap)
        if m.observed:  # the scores come from the storage; the kernels attend as usual
            self._record_scores(layer_idx, q, kv.keys, None, scale)
        return self._kernel(q, kv.keys, kv.values, scale, sliding_window)

    def attend_compressed(self, layer_idx: int, kv: CompressedBlocks, q: torch.Tensor, scale: float,
                          sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        m = self.metadata
        if softcap is not None or m.hidden or m.observed or not kv.kernel_readable:
            return super().attend_compressed(layer_idx, kv, q, scale, sliding_window, softcap)
        return self.attend_fused(kv, q, scale, sliding_window)

    def attend_fused(self, kv: CompressedBlocks, q: torch.Tensor, scale: float,
                     sliding_window: int | None) -> torch.Tensor:
        """Fused-dequant kernels on the quantized blocks in place, the touched blocks as their tail."""
        keys, values = kv.stores
        return self._kernel(q, keys.kernel_operand(), values.kernel_operand(), scale, sliding_window,
                            tail=self._tail(kv))

    def _kernel(self, q: torch.Tensor, key_cache, value_cache, scale: float, sliding_window: int | None,
                tail: FullPrecisionTail | None = None) -> torch.Tensor:
        from hf_paged.cache.kernels import paged_decode_attention, paged_prefill_attention

        m, device, q = self.metadata, q.device, q.contiguous()
        tables, context_lens = m.block_tables_on(device), m.context_lens_on(device)
        if m.max_query_len == 1 and q.shape[0] == m.num_seqs:  # all decodes: split-K decode kernel
            return paged_decode_attention(q, key_cache, value_cache, tables, context_lens, scale=scale,
                                          sliding_window=sliding_window, tail=tail, backend="triton")
        return paged_prefill_attention(q, key_cache, value_cache, tables, m.query_start_loc_on(device),
                                       context_lens, scale=scale, sliding_window=sliding_window, tail=tail,
                                       backend="triton")
