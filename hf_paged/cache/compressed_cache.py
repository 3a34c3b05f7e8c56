"""The compressed-storage side of `PagedCache` (a mixin, so `paged_cache.py` stays about one concept).

Active when `PagedConfig.key_dtype` or `value_dtype` quantizes (fp8, int8, int4), or when
`PagedConfig.kv_streaming_heads` names heads (their small store needs the same block life cycle, even in "auto").
See `compressed_blocks` for the block life cycle (staged while partial, quantized once when full) and for what a
query reads, `streaming_heads` for the streaming heads' slots.
"""

from __future__ import annotations

import torch

from hf_paged.cache.compressed_blocks import CompressedKV, SeqSpan, StagingMap, StepPlan, plan_step
from hf_paged.cache.compression import BlockFormat, formats_for
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.sizing import budget_bytes, max_useful_blocks
from hf_paged.cache.streaming_heads import SlotMap, plan_stream_step



class CompressedCacheMixin:
    """Compressed block storage for `PagedCache`: formats, staging, per-step plans, swaps."""

    def _init_compression(self) -> None:
        cfg = self.paged_config
        if cfg.kv_key_derotate and not self.kv_shape.rope_frequencies:
            raise ValueError(
                "PagedConfig.kv_key_derotate=True needs the model's RoPE frequencies, but its config names no "
                "rope_theta (rope_parameters); set kv_key_derotate=False for this model"
            )
        frequencies = self.kv_shape.rope_frequencies if cfg.kv_key_derotate else ()
        self.key_format, self.value_format = formats_for(cfg.key_dtype, cfg.value_dtype, cfg.value_quant_group,
                                                         cfg.kv_scale_format, frequencies)
        streaming = cfg.kv_streaming_heads
        self.compressed = self.key_format.is_quantized or self.value_format.is_quantized or bool(
            streaming and any(streaming))
        for fmt in (self.key_format, self.value_format):  # e.g. int4 needs an even head_dim: fail now, not mid-forward
            fmt.part_shapes(self.block_size, self.kv_shape.num_kv_heads, self.kv_shape.head_dim)
        s = self.kv_shape
        for name in ("kv_full_precision_heads", "kv_streaming_heads"):
            heads = getattr(cfg, name)
            if heads is not None and (len(heads) > s.num_layers or any(h >= s.num_kv_heads for l in heads for h in l)):
                raise ValueError(
                    f"PagedConfig.{name}={heads!r} does not fit the model: allowed at most "
                    f"{s.num_layers} layers of KV head indices in [0, {s.num_kv_heads})"
                )
        # One partial block per live sequence at most; reclaimed and grown on demand (forks, beams).
        self.staging = StagingMap(min(cfg.max_num_seqs, self.num_blocks) + 2)
        # Streaming heads: sinks + window blocks per sequence (+2: the block filling now, one released this step).
        self.sink_blocks = -(-cfg.num_sink_tokens // self.block_size)
        self.window_blocks = -(-cfg.window_tokens // self.block_size)
        per_seq = self.sink_blocks + self.window_blocks + 2
        self.slots = SlotMap(min(cfg.max_num_seqs * per_seq, 4 * per_seq, self.num_blocks))
        self._dense_plan: StepPlan | None = None

    def _compressed_num_blocks(self, model_dtype: torch.dtype, device) -> int:
        """What the budget buys in quantized blocks once the staging rows and the streaming heads' store are paid
        for, so that `max_cache_bytes` bounds all of it. n blocks need min(max_num_seqs, n) + 2 staging rows (one
        model-dtype block per partially written block, see `_init_compression`)."""
        cfg = self.paged_config
        dense = self.kv_shape.bytes_per_block(self.block_size, model_dtype)
        per_block = max(1, self.compressed_bytes_per_block(model_dtype))
        per_seq = self.sink_blocks + self.window_blocks + 2
        slots = min(cfg.max_num_seqs * per_seq, 4 * per_seq) * self.streaming_bytes_per_slot(model_dtype)
        budget = budget_bytes(cfg, device) - slots - 2 * dense
        blocks = budget // (per_block + dense)  # while n <= max_num_seqs, each block brings a staging row
        if blocks > cfg.max_num_seqs:
            blocks = (budget - cfg.max_num_seqs * dense) // per_block
        if cfg.max_cache_bytes is None:  # the default budget: no more than the sequences could use
            blocks = min(blocks, max_useful_blocks(cfg, self.kv_shape))
        if blocks < 1:
            raise ValueError(
                f"PagedConfig.max_cache_bytes={cfg.max_cache_bytes} cannot hold one compressed block beside the "
                f"full-precision staging rows of partially written blocks ({dense} bytes each, at least 3); raise "
                "max_cache_bytes"
            )
        return int(blocks)

    def _layer_heads(self, name: str, layer_idx: int) -> list[int]:
        chosen = getattr(self.paged_config, name)
        return sorted(set(chosen[layer_idx])) if chosen is not None and layer_idx < len(chosen) else []

    def head_groups(self, layer_idx: int, num_kv_heads: int) -> tuple[list, list]:
        """(key groups, value groups) of `(kv head indices, format)`: heads named in
        `PagedConfig.kv_full_precision_heads[layer_idx]` stay in the model dtype, the rest use the configured format.
        Streaming heads (`streaming_groups`) are in neither."""
        full = self._layer_heads("kv_full_precision_heads", layer_idx)
        streaming = self._layer_heads("kv_streaming_heads", layer_idx)
        rest = [h for h in range(num_kv_heads) if h not in full and h not in streaming]
        auto = BlockFormat("auto")
        return [(full, auto), (rest, self.key_format)], [(full, auto), (rest, self.value_format)]

    def streaming_groups(self, layer_idx: int) -> tuple:
        """(key, value) `(streaming kv heads, format)` of a layer: the format of its other compressed heads."""
        heads = self._layer_heads("kv_streaming_heads", layer_idx)
        return (heads, self.key_format), (heads, self.value_format)

    def compressed_bytes_per_block(self, dtype: torch.dtype) -> int:
        """Main-storage bytes of one block over every layer (staging rows and streaming slots not included)."""
        return self._group_bytes(dtype, lambda i: self.head_groups(i, self.kv_shape.num_kv_heads))

    def streaming_bytes_per_slot(self, dtype: torch.dtype) -> int:
        """Bytes of one streaming-store slot over every layer (0 without streaming heads)."""
        return self._group_bytes(dtype, lambda i: [[g] for g in self.streaming_groups(i)])

    def _group_bytes(self, dtype: torch.dtype, groups_of) -> int:
        s = self.kv_shape
        total = 0
        for layer_idx in range(s.num_layers):
            for groups in groups_of(layer_idx):
                for heads, fmt in groups:
                    if heads:
                        total += fmt.bytes_per_block(self.block_size, len(heads), s.head_dim, dtype)
        return total

    def new_compressed_storage(self, layer_idx: int, num_kv_heads: int, head_dim: int, like: torch.Tensor) -> tuple:
        args = (self.num_blocks, self.block_size, num_kv_heads, head_dim, like.dtype, like.device,
                self.staging.high_water)  # staging rows grow with use (`_plan`), not to the map's capacity at once
        key_groups, value_groups = self.head_groups(layer_idx, num_kv_heads)
        key_stream, value_stream = self.streaming_groups(layer_idx)
        with torch.inference_mode(False):  # swaps and copy-on-write write the storage outside inference mode
            return (CompressedKV(key_groups, *args, stream=key_stream, slot_capacity=self.slots.capacity),
                    CompressedKV(value_groups, *args, stream=value_stream, slot_capacity=self.slots.capacity))

    def _live_blocks(self) -> set[int]:
        return {b for s in self.manager.seqs.values() for b in s.block_ids}

    def _plan(self, spans: list[SeqSpan], live: dict | None = None) -> StepPlan:
        """`live`: every live sequence's (block ids, tokens after the step); default: the manager's sequences."""
        plan = plan_step(spans, self.block_size, self.staging, self._live_blocks)
        heads = self.paged_config.kv_streaming_heads
        if heads and any(heads):
            if live is None:
                live = {k: (s.block_ids, s.num_tokens) for k, s in self.manager.seqs.items()}
            plan.stream = plan_stream_step(self.slots, live, plan.full_ids.tolist(), plan.ref_full_ids.tolist(),
                                           self.block_size, heads, self.sink_blocks, self.window_blocks)
        for layer in self.layers:
            if layer.compressed is not None:
                for store in layer.compressed:
                    store.grow_staging(self.staging.high_water)
                    store.grow_slots(self.slots.capacity)
        return plan

    def kv_bytes_in_use(self, dtype: torch.dtype) -> int:
        """KV bytes the live sequences hold, costing "auto" parts in `dtype`: blocks in block tables x bytes of
        the block groups, plus streaming slots of those blocks x bytes of the streaming groups. Staging rows (one
        partial block per sequence, model dtype) are not included."""
        live = self._live_blocks()
        if not self.compressed:
            return len(live) * self.kv_shape.bytes_per_block(self.block_size, dtype)
        num_slots = sum(1 for b in self.slots.rows if b in live)
        return len(live) * self.compressed_bytes_per_block(dtype) + num_slots * self.streaming_bytes_per_slot(dtype)

    def step_plan_of(self, metadata: PagedMetadata) -> StepPlan:
        """The engine step's plan, built at the first layer and shared by the others through the metadata."""
        plan = metadata.plans.compressed
        if plan is None:
            tables = metadata.block_tables.tolist()
            spans = []
            for i, context_len in enumerate(metadata.context_lens):
                q_len = metadata.query_start_loc[i + 1] - metadata.query_start_loc[i]
                table = tables[i][: -(-context_len // self.block_size)]
                spans.append(SeqSpan(table, context_len - q_len, context_len))
            plan = metadata.plans.compressed = self._plan(spans)
        return plan

    def write_and_read(self, layer, key: torch.Tensor, value: torch.Tensor, plan: StepPlan, *, defer_read=False):
        """Store one layer's new K/V `[T, H, D]`; return the step's read buffers `[n, bs, H, D]`.

        `defer_read` (packed engine path): when every head of the layer has one format, return only the touched
        blocks in full precision and leave the quantized blocks where they are (`kernel_stores` in the plan): the
        attention reads them with the fused-dequant kernels, or calls `CompressedKV.read` itself."""
        keys, values = layer.compressed
        temp_k, temp_v = keys.write(plan, key), values.write(plan, value)
        if defer_read and keys.kernel_readable and values.kernel_readable:
            plan.kernel_stores[layer.layer_idx] = layer.compressed
            return temp_k, temp_v
        return keys.read(plan, temp_k), values.read(plan, temp_v)

    def dense_compressed(self, layer, key_states: torch.Tensor, value_states: torch.Tensor, start: int, new_step: bool):
        """Stock path: store `[batch, H, q, D]` for every row; return dense `[batch, H, start + q, D]` K/V."""
        batch, heads, q_len, dim = key_states.shape
        if new_step or self._dense_plan is None:
            spans = [SeqSpan(self.manager.block_ids(r), start, start + q_len) for r in range(batch)]
            self._dense_plan = self._plan(spans)
        plan = self._dense_plan
        key = key_states.transpose(1, 2).reshape(batch * q_len, heads, dim)
        value = value_states.transpose(1, 2).reshape(batch * q_len, heads, dim)
        k_buf, v_buf = self.write_and_read(layer, key, value, plan)
        total = start + q_len
        positions = torch.arange(total)
        rows = torch.stack([torch.tensor(t)[positions // self.block_size] for t in plan.virtual_tables])
        slots = (rows * self.block_size + positions % self.block_size).view(-1).to(k_buf.device)
        keys = k_buf.view(-1, heads, dim).index_select(0, slots).view(batch, total, heads, dim)
        values = v_buf.view(-1, heads, dim).index_select(0, slots).view(batch, total, heads, dim)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def copy_staging(self, src_block_id: int, dst_block_id: int) -> None:
        """Copy-on-write of a partial block: the copy gets its own staging row with the same contents."""
        src_row = self.staging.rows.get(src_block_id)
        if src_row is None:
            return
        dst_row = self.staging.assign(dst_block_id, lambda: self._live_blocks() | {src_block_id})
        for layer in self.layers:
            if layer.compressed is not None:
                for store in layer.compressed:
                    store.grow_staging(self.staging.high_water)
                    store.staging[dst_row] = store.staging[src_row]

    # -- swap (preemption) ---------------------------------------------------------------------------------
    def save_blocks(self, block_ids: list[int]) -> list:
        """CPU copies of the blocks' K/V in every layer (staged contents of partial blocks included)."""
        idx = torch.tensor(block_ids, dtype=torch.long)
        saved = []
        for layer in self.layers:
            if not layer.is_initialized:
                saved.append(None)
            elif layer.compressed is None:
                i = idx.to(layer.device)
                saved.append((layer.key_cache[i].to("cpu"), layer.value_cache[i].to("cpu")))
            else:
                i = idx.to(layer.device)
                staged = {n: self.staging.rows[b] for n, b in enumerate(block_ids) if b in self.staging.rows}
                saved.append([
                    ({k: t[i].to("cpu") for k, t in store.parts.items()},
                     {n: store.staging[row].to("cpu", copy=True) for n, row in staged.items()})
                    for store in layer.compressed
                ])
        return saved

    def load_blocks(self, block_ids: list[int], saved: list) -> None:
        """Write back what `save_blocks` copied, into (possibly other) blocks `block_ids`."""
        idx = torch.tensor(block_ids, dtype=torch.long)
        for layer, entry in zip(self.layers, saved):
            if entry is None:
                continue
            i = idx.to(layer.device)
            if layer.compressed is None:
                layer.key_cache[i] = entry[0].to(layer.device)
                layer.value_cache[i] = entry[1].to(layer.device)
                continue
            for store, (parts, staged) in zip(layer.compressed, entry):
                for k, t in store.parts.items():
                    t[i] = parts[k].to(layer.device)
                for n, contents in staged.items():
                    row = self.staging.assign(block_ids[n], lambda: self._live_blocks() | set(block_ids))
                    store.grow_staging(self.staging.high_water)
                    store.staging[row] = contents.to(layer.device)

