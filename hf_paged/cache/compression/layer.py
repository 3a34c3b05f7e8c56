"""`CompressedLayer`: one decoder layer's K/V in compressed blocks (quantized, head groups, streaming heads).

The layer owns a `CompressedKV` for its keys and one for its values (`compressed`): each holds the quantized main
storage of every block (per head group: retrieval heads in full precision, the others quantized), the full-precision
staging rows of partially written blocks, and, with streaming heads (DuoAttention), the slots of the blocks in
their sinks + window. Which staging row or slot a block has is shared by every layer (`CompressedPlanner`); the
step's `StepPlan` is built once from the block tables and applied by each layer to its own tensors:

    write(key, value, plan)
      staging rows grown to the planner's high water -> keys.write / values.write (quantize blocks that filled)
      -> the touched blocks in full precision
    engine path: a `CompressedBlocks` (`layer_kv`): the stores, the touched blocks, the plan; attention reads the
                 quantized blocks in place (fused kernels) or asks it for the read buffers (torch path)
    stock path:  the step's read buffers, gathered into the dense history stock attention expects
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hf_paged.cache.block_layer import BlockLayer
from hf_paged.cache.compression.blocks import CompressedKV, StepPlan
from hf_paged.cache.compression.planner import CompressedPlanner, StagingCopy
from hf_paged.cache.layer_kv import CompressedBlocks
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.stock_rows import StockRows


@dataclass(slots=True)
class SavedStore:
    """CPU copies of some blocks of one `CompressedKV` (swap)."""

    parts: dict[str, torch.Tensor]  # part name -> [n, ...] main storage of the blocks
    staged: dict[int, torch.Tensor] = field(default_factory=dict)  # index in the block list -> its staging row


@dataclass(slots=True)
class SavedCompressedBlocks:
    """CPU copies of some blocks of a `CompressedLayer`: keys, then values."""

    stores: list[SavedStore]


class CompressedLayer(BlockLayer):
    """One decoder layer's K/V as `(keys, values)` `CompressedKV` stores (see `compression.blocks`)."""

    def __init__(self, layer_idx: int, rows: StockRows, planner: CompressedPlanner) -> None:
        super().__init__(layer_idx, rows)
        self.planner = planner  # staging rows, streaming slots and step plans shared with the other layers
        self.compressed: tuple[CompressedKV, CompressedKV] | None = None  # (keys, values), at the first update

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        num_kv_heads, head_dim = key_states.shape[1], key_states.shape[-1]
        self.device = key_states.device
        spec, planner = self.planner.spec, self.planner
        args = (planner.num_blocks, spec.block_size, num_kv_heads, head_dim, key_states.dtype, key_states.device,
                planner.staging.high_water)  # staging rows grow with use (`_fit`), not to the map's capacity at once
        key_groups, value_groups = spec.head_groups(self.layer_idx, num_kv_heads)
        key_stream, value_stream = spec.streaming_groups(self.layer_idx)
        huge = spec.cfg.kv_huge_pages  # the block pools on 2 MiB-aligned memory, as `PagedLayer`'s
        with torch.inference_mode(False):  # swaps and copy-on-write write the storage outside inference mode
            self.compressed = (
                CompressedKV(key_groups, *args, stream=key_stream, slot_capacity=planner.slots.capacity,
                             huge_pages=huge),
                CompressedKV(value_groups, *args, stream=value_stream, slot_capacity=planner.slots.capacity,
                             huge_pages=huge),
            )
        self.is_initialized = True

    @property
    def stores(self) -> tuple[CompressedKV, CompressedKV]:
        if self.compressed is None:
            raise RuntimeError(f"layer {self.layer_idx} has no storage before its first update")
        return self.compressed

    def _fit(self) -> None:
        """Grow the staging rows and streaming slots to what the shared maps may now hand out."""
        for store in self.stores:
            store.grow_staging(self.planner.staging.high_water, self.planner.staging.capacity)
            store.grow_slots(self.planner.slots.capacity)

    # -- writes and reads --------------------------------------------------------------------------------
    def write(self, key: torch.Tensor, value: torch.Tensor, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the layer's new K/V `[T, H, D]` as `plan` says; return the touched blocks `[n, bs, H, D]` in full
        precision (indexed as `plan.touched_ids`)."""
        keys, values = self.stores
        self._fit()
        return keys.write(plan, key), values.write(plan, value)

    def store_packed(self, key: torch.Tensor, value: torch.Tensor, metadata: PagedMetadata) -> CompressedBlocks:
        plan = self.planner.step_plan_of(metadata)
        touched_k, touched_v = self.write(key, value, plan)
        heads = plan.stream.layer_heads(self.layer_idx) if plan.stream is not None else ()
        return CompressedBlocks(plan, self.stores, touched_k, touched_v, heads)

    def update_dense(self, key_states: torch.Tensor,
                     value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `[batch, H, q, D]` for every row; return dense `[batch, H, start + q, D]` K/V read through the
        plan's virtual tables (quantized full blocks dequantized, the open blocks in full precision)."""
        batch, heads, q_len, dim = key_states.shape
        write = self.rows.begin(self.layer_idx, batch, q_len)
        plan = self.planner.stock_step_plan(batch, write.start, write.end, new_step=write.new_step)
        key = key_states.transpose(1, 2).reshape(batch * q_len, heads, dim)
        value = value_states.transpose(1, 2).reshape(batch * q_len, heads, dim)
        keys, values = self.stores
        touched_k, touched_v = self.write(key, value, plan)
        k_buf, v_buf = keys.read(plan, touched_k), values.read(plan, touched_v)
        total, bs = write.end, self.planner.block_size
        positions = torch.arange(total)
        rows = torch.stack([torch.tensor(t)[positions // bs] for t in plan.virtual_tables])
        slots = (rows * bs + positions % bs).view(-1).to(k_buf.device)
        keys = k_buf.view(-1, heads, dim).index_select(0, slots).view(batch, total, heads, dim)
        values = v_buf.view(-1, heads, dim).index_select(0, slots).view(batch, total, heads, dim)
        return keys.transpose(1, 2), values.transpose(1, 2)

    # -- block copies and swaps ----------------------------------------------------------------------------
    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor,
                    staging_copies: list[StagingCopy] | None = None) -> None:
        if not self.is_initialized:
            return
        for store in self.stores:
            for copy in staging_copies or ():
                store.grow_staging(copy.num_rows, self.planner.staging.capacity)  # copy by copy: rows double
                store.staging[copy.dst_row] = store.staging[copy.src_row]
            for t in store.parts.values():
                t[dst.to(self.device)] = t[src.to(self.device)]

    def save_blocks(self, block_ids: list[int]) -> SavedCompressedBlocks | None:
        """CPU copies of the blocks' main storage, and of the staged contents of partially written ones."""
        if not self.is_initialized:
            return None
        i = torch.tensor(block_ids, dtype=torch.long).to(self.device)
        rows = self.planner.staging.rows
        staged = {n: rows[b] for n, b in enumerate(block_ids) if b in rows}
        return SavedCompressedBlocks([
            SavedStore({k: t[i].to("cpu") for k, t in store.parts.items()},
                       {n: store.staging[row].to("cpu", copy=True) for n, row in staged.items()})
            for store in self.stores
        ])

    def load_blocks(self, block_ids: list[int], saved: object) -> None:
        if not isinstance(saved, SavedCompressedBlocks):
            raise TypeError(f"layer {self.layer_idx} holds compressed blocks; got {type(saved).__name__} to load")
        i = torch.tensor(block_ids, dtype=torch.long).to(self.device)
        for store, copy in zip(self.stores, saved.stores):
            for k, t in store.parts.items():
                t[i] = copy.parts[k].to(self.device)
            for n, contents in copy.staged.items():
                row = self.planner.staging_row_for_load(block_ids[n], block_ids)
                store.grow_staging(self.planner.staging.high_water, self.planner.staging.capacity)
                store.staging[row] = contents.to(self.device)

    # -- sizes -----------------------------------------------------------------------------------------
    def nbytes(self) -> int:
        return 0 if self.compressed is None else sum(store.nbytes() for store in self.compressed)

    def staging_nbytes(self) -> int:
        return 0 if self.compressed is None else sum(store.staging.nbytes for store in self.compressed)

    @property
    def storage_dtype(self) -> torch.dtype | None:
        return None if self.compressed is None else self.compressed[0].dtype
