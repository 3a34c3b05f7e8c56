"""Compressed block storage: full blocks quantized once, the block being written kept in full precision.

    a sequence's table (block_size 4), this step writes positions 6..9
    | b7: t0..t3 | b2: t4 t5 t6 t7 | b9: t8 t9 _ _ |
      quantized    staged -> full:   fresh -> partial: written into a staging row (model dtype)
                   quantized now
A partially written block lives in a small per-layer staging area (`[capacity, bs, H, D]`, model dtype) found
through `StagingMap` (block id -> staging row, shared by every layer). One step's writes go through a temporary
full-precision copy of the touched blocks: staged rows are read, the new tokens scattered in, blocks that became
full are quantized into the main storage and the others written back to staging. The map is planned once per
step (`plan_step`) before any layer writes, so every layer applies the same plan.

What a query reads (so that results do not depend on how a prompt was split into chunks): a query at position q
sees a key quantized when the key's block is full at q (its last slot <= q), else in full precision. That is
what one-token-at-a-time decoding sees; a prefill chunk reproduces it by attending to two copies of the keys of
its own blocks (the dequantized one and the full-precision one) under a mask that picks one per query.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hf_paged.cache.compression.formats import BlockFormat
from hf_paged.cache.compression.streaming_heads import (
    StreamStep,
    read_streaming_heads,
    streaming_plan,
    write_streaming_heads,
)
from hf_paged.cache.kernels.reference import AttentionPlan, build_attention_plan


@dataclass(slots=True)
class SeqSpan:
    """One sequence of a step: its block table and the table positions written this step."""

    block_ids: list[int]
    start: int  # first table position written this step
    end: int  # one past the last (= tokens in the table after the step)


@dataclass(slots=True)
class StepPlan:
    """The writes and reads of one step, shared by every layer."""

    spans: list[SeqSpan]
    block_size: int
    touched_ids: list[int]  # blocks written this step, in order of first touch
    token_rows: torch.Tensor  # [T] row of each new token in the flat temporary copy [n_touched * bs]
    read_pos: torch.Tensor  # [k] touched indices of blocks partially written before this step
    read_rows: torch.Tensor  # [k] their staging rows
    full_pos: torch.Tensor  # touched indices of blocks full after this step (quantized now)
    full_ids: torch.Tensor  # their block ids
    partial_pos: torch.Tensor  # touched indices of blocks still partial after this step
    partial_rows: torch.Tensor  # their staging rows
    ref_full_ids: torch.Tensor  # every full block the step reads (dequantized into the read buffer)
    virtual_tables: list[list[int]]  # per span: read-buffer block index of each table entry (main copy)
    read_plans: dict = field(default_factory=dict)  # (device, sliding_window) -> torch plan over the read buffer
    stream: StreamStep | None = None  # streaming heads' slots (`streaming_heads`); None without streaming heads

    def attention_plan(self, device: torch.device, sliding_window: int | None) -> AttentionPlan:
        key = (device, sliding_window)
        plan = self.read_plans.get(key)
        if plan is None:
            plan = self.read_plans[key] = _build_read_plan(self, device, sliding_window)
        return plan

    def streaming_attention_plan(self, device: torch.device, sliding_window: int | None) -> AttentionPlan:
        """What the streaming heads see: the plan restricted to sinks + window (see `streaming_heads`)."""
        key = (device, sliding_window)
        plan = self.stream.plans.get(key)
        if plan is None:
            base = self.attention_plan(device, sliding_window)
            plan = self.stream.plans[key] = streaming_plan(base, self.stream, self.spans, self.virtual_tables,
                                                           self.block_size, device, sliding_window)
        return plan


class StagingMap:
    """Block id -> staging row. Rows of blocks nobody holds any more are reclaimed when rows run out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: dict[int, int] = {}
        self.free_rows: list[int] = list(range(capacity - 1, -1, -1))  # lowest first: rows in use stay low
        self.high_water = 0  # one past the highest row ever assigned: what the layers' staging must hold

    def release(self, block_id: int) -> None:
        row = self.rows.pop(block_id, None)
        if row is not None:
            self.free_rows.append(row)

    def assign(self, block_id: int, live_blocks) -> int:
        """A row for `block_id`; when none is free, drop rows of blocks that no live block table holds
        (`live_blocks()`: their sequence ended or was preempted), then grow."""
        row = self.rows.get(block_id)
        if row is not None:
            return row
        if not self.free_rows:
            keep = live_blocks() | {block_id}
            for stale in [b for b in self.rows if b not in keep]:
                self.release(stale)
        if not self.free_rows:
            grown = max(4, self.capacity)
            self.free_rows = list(range(self.capacity + grown - 1, self.capacity - 1, -1))
            self.capacity += grown
        row = self.rows[block_id] = self.free_rows.pop()
        self.high_water = max(self.high_water, row + 1)
        return row


def plan_step(spans: list[SeqSpan], block_size: int, staging: StagingMap, live_blocks) -> StepPlan:
    """Plan one step's writes (staging rows assigned and released) and reads. `live_blocks()`: the blocks of
    every live block table (their staging rows must survive a reclaim)."""
    bs = block_size
    touched: dict[int, int] = {}
    token_rows: list[int] = []
    read_pos, read_rows, full_pos, full_ids, partial_pos, partial_ids = [], [], [], [], [], []
    for span in spans:
        for b_idx in range(span.start // bs, -(-span.end // bs)):
            block_id = span.block_ids[b_idx]
            if block_id in touched:
                raise RuntimeError(f"block {block_id} is written by two sequences in one step (copy-on-write missed)")
            pos = touched[block_id] = len(touched)
            if span.start > b_idx * bs:  # partially written by an earlier step: its contents are staged
                if block_id not in staging.rows:
                    raise RuntimeError(f"block {block_id} is partially written but has no staging row")
                read_pos.append(pos)
                read_rows.append(staging.rows[block_id])
            if span.end >= (b_idx + 1) * bs:
                full_pos.append(pos)
                full_ids.append(block_id)
            else:
                partial_pos.append(pos)
                partial_ids.append(block_id)
        for p in range(span.start, span.end):
            token_rows.append(touched[span.block_ids[p // bs]] * bs + p % bs)
    for block_id in full_ids:
        staging.release(block_id)
    partial_rows = [staging.assign(b, lambda: live_blocks() | set(touched)) for b in partial_ids]
    # Reads: full blocks come dequantized (first part of the read buffer), touched blocks in full precision.
    ref_full: dict[int, int] = {}
    virtual_tables = []
    for span in spans:
        table = []
        for b_idx in range(-(-span.end // bs)):
            block_id = span.block_ids[b_idx]
            if span.end >= (b_idx + 1) * bs:
                table.append(ref_full.setdefault(block_id, len(ref_full)))
            else:
                table.append(-1 - touched[block_id])  # resolved below, once the number of full blocks is known
        virtual_tables.append(table)
    n_full = len(ref_full)
    virtual_tables = [[b if b >= 0 else n_full - 1 - b for b in t] for t in virtual_tables]
    return StepPlan(
        spans, bs, list(touched), _long(token_rows), _long(read_pos), _long(read_rows), _long(full_pos),
        _long(full_ids), _long(partial_pos), _long(partial_rows), _long(list(ref_full)), virtual_tables,
    )


def _long(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def _build_read_plan(step: StepPlan, device: torch.device, sliding_window: int | None) -> AttentionPlan:
    bs = step.block_size
    width = max((len(t) for t in step.virtual_tables), default=1)
    tables = torch.zeros((len(step.spans), max(width, 1)), dtype=torch.long)
    for i, t in enumerate(step.virtual_tables):
        tables[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    query_start_loc = [0]
    for span in step.spans:
        query_start_loc.append(query_start_loc[-1] + span.end - span.start)
    context_lens = [span.end for span in step.spans]
    plan = build_attention_plan(tables.to(device), query_start_loc, context_lens, bs, sliding_window)
    n_full = int(step.ref_full_ids.numel())
    touched = {b: i for i, b in enumerate(step.touched_ids)}
    groups = iter(plan.prefills)
    for span in step.spans:
        if span.end - span.start <= 1:
            continue
        group = next(groups)
        first = span.start // bs * bs  # the chunk's own blocks start here: they get a full-precision copy
        pos = torch.arange(first, span.end)
        fp_rows = torch.tensor([n_full + touched[span.block_ids[p // bs]] for p in range(first, span.end, bs)])
        extra = fp_rows.repeat_interleave(bs)[: span.end - first] * bs + pos % bs
        keys = torch.arange(span.end)
        q = torch.arange(span.start, span.end)[:, None]
        q_last = (q + 1) % bs == 0  # the query fills its block: it sees that block quantized
        main = (keys[None, :] <= q) & ((keys[None, :] // bs < q // bs) | q_last)
        copy = (pos[None, :] <= q) & (pos[None, :] // bs == q // bs) & ~q_last
        if sliding_window is not None:
            main &= keys[None, :] > q - sliding_window
            copy &= pos[None, :] > q - sliding_window
        group.slots = torch.cat((group.slots, extra.to(device)))
        group.mask = torch.cat((main, copy), dim=1).to(device)
    return plan


class CompressedKV:
    """One layer's K or V: quantized main storage plus full-precision staging rows.

    Heads may be split into groups with their own format (head-aware precision: retrieval heads kept in full
    precision, the others quantized); each group's parts are named "<group>.<part>", all with the block id as
    leading dim, so copies and swaps treat them alike. Streaming heads (`stream`: heads and format) are not a
    block group: their parts `slot_parts["<part>"]` have one row per slot of the streaming store (`SlotMap`),
    far fewer than blocks, and only full blocks in some sequence's sinks or window have one.
    """

    def __init__(self, groups: list[tuple[list[int], BlockFormat]], num_blocks: int, block_size: int,
                 num_heads: int, head_dim: int, dtype: torch.dtype, device, staging_capacity: int,
                 stream: tuple[list[int], BlockFormat] | None = None, slot_capacity: int = 0,
                 huge_pages: bool = False) -> None:
        self.groups = [(torch.tensor(heads, dtype=torch.long), fmt) for heads, fmt in groups if heads]
        self.whole = len(self.groups) == 1 and len(self.groups[0][0]) == num_heads
        self.dtype = dtype
        self.parts = {}
        for g, (heads, fmt) in enumerate(self.groups):
            for name, t in fmt.allocate(num_blocks, block_size, len(heads), head_dim, dtype, device,
                                        huge_pages=huge_pages).items():
                self.parts[f"{g}.{name}"] = t
        self.staging = torch.zeros((staging_capacity, block_size, num_heads, head_dim), dtype=dtype, device=device)
        self.stream = None if stream is None or not stream[0] else (torch.tensor(stream[0], dtype=torch.long),
                                                                     stream[1])
        self.slot_parts: dict[str, torch.Tensor] = {}
        if self.stream is not None:
            self.slot_parts = self.stream[1].allocate(slot_capacity, block_size, len(stream[0]), head_dim, dtype,
                                                      device)
        self._fresh: torch.Tensor | None = None  # streaming heads of the blocks quantized this step, dequantized

    @property
    def format(self) -> BlockFormat:
        return self.groups[0][1]

    def grow_staging(self, capacity: int, limit: int) -> None:
        """Hold at least `capacity` staging rows, grown by doubling (rows are resident once allocated) but never
        past `limit`, the staging map's capacity: the rows `max_cache_bytes` paid for (`CompressionSpec`)."""
        rows = self.staging.shape[0]
        if capacity > rows:
            extra = max(capacity, min(2 * rows, limit)) - rows
            with torch.inference_mode(False):  # grown during a forward, written by swaps outside inference mode
                pad = self.staging.new_zeros((extra, *self.staging.shape[1:]))
                self.staging = torch.cat((self.staging, pad))

    def grow_slots(self, capacity: int) -> None:
        for name, t in self.slot_parts.items():
            if capacity > t.shape[0]:
                self.slot_parts[name] = torch.cat((t, t.new_zeros((capacity - t.shape[0], *t.shape[1:]))))

    def _group_parts(self, g: int) -> dict[str, torch.Tensor]:
        prefix = f"{g}."
        return {name[len(prefix):]: t for name, t in self.parts.items() if name.startswith(prefix)}

    def write(self, step: StepPlan, new: torch.Tensor) -> torch.Tensor:
        """Apply `step`'s writes of `new` `[T, H, D]`; returns the touched blocks in full precision."""
        device = new.device
        shape = (len(step.touched_ids), step.block_size, *new.shape[1:])
        temp = torch.zeros(shape, dtype=self.dtype, device=device)
        if step.read_pos.numel():
            temp.index_copy_(0, step.read_pos.to(device), self.staging.index_select(0, step.read_rows.to(device)))
        temp.view(-1, *new.shape[1:]).index_copy_(0, step.token_rows.to(device), new.to(self.dtype))
        if step.full_pos.numel():
            full = temp.index_select(0, step.full_pos.to(device))
            full_ids = step.full_ids.to(device)
            for g, (heads, fmt) in enumerate(self.groups):
                x = full if self.whole else full.index_select(2, heads.to(device))
                quantized = fmt.quantize(x)
                for name, t in self._group_parts(g).items():
                    data = quantized[name].to(t.dtype)
                    if t.element_size() == 1:  # index_copy_ has no float8 kernels: copy the bytes
                        t, data = t.view(torch.uint8), data.view(torch.uint8)
                    t.index_copy_(0, full_ids, data)
            if self.stream is not None:
                self._fresh = write_streaming_heads(self.stream, self.slot_parts, step.stream, full, self.dtype)
        if step.partial_pos.numel():
            self.staging.index_copy_(0, step.partial_rows.to(device), temp.index_select(0, step.partial_pos.to(device)))
        return temp

    def dequantize(self, block_ids: torch.Tensor) -> torch.Tensor:
        """Blocks `[n, bs, H, D]` in the model dtype (streaming heads, if any, left as zeros: see `read`)."""
        out = None
        for g, (heads, fmt) in enumerate(self.groups):
            parts = {n: t.index_select(0, block_ids) for n, t in self._group_parts(g).items()}
            x = fmt.dequantize(parts, self.dtype)
            if self.whole:
                return x
            if out is None:
                out = x.new_zeros((x.shape[0], x.shape[1], self.staging.shape[2], x.shape[3]))
            out[:, :, heads.to(x.device)] = x
        if out is None:  # every head of the layer streams
            out = self.staging.new_zeros((block_ids.numel(), *self.staging.shape[1:]))
        return out

    def read(self, step: StepPlan, temp: torch.Tensor) -> torch.Tensor:
        """The read buffer of the step: referenced full blocks dequantized, then the touched blocks."""
        if not step.ref_full_ids.numel():
            return temp
        full = self.dequantize(step.ref_full_ids.to(temp.device))
        if self.stream is not None:
            read_streaming_heads(self.stream, self.slot_parts, step.stream, full, self._fresh, self.dtype)
            self._fresh = None  # this step's only: not held between steps (h55: 79% of a small pool's bytes)
        return torch.cat((full, temp))

    def nbytes(self) -> int:
        slots = sum(t.nbytes for t in self.slot_parts.values()) + (self._fresh.nbytes if self._fresh is not None else 0)
        return sum(t.nbytes for t in self.parts.values()) + self.staging.nbytes + slots

    @property
    def kernel_readable(self) -> bool:
        """Whether the fused kernels can read the main storage: one format for every head, no streaming heads,
        keys not in the block's RoPE frame (`key_frame`: the kernels do not rotate)."""
        return self.whole and self.stream is None and not self.format.rope_frequencies

    def kernel_operand(self):
        """The main storage as the paged kernels take it (one format for all heads, no streaming heads): a plain
        `[num_blocks, bs, H, D]` tensor ("auto") or a `QuantizedKV` over the parts, dequantized by the kernels."""
        from hf_paged.cache.kernels.quantized import QuantizedKV

        if not self.whole or self.stream is not None:
            raise ValueError("kernel_operand() needs one format for every head of the layer (no head groups)")
        if self.format.rope_frequencies:
            raise ValueError(
                "the fused kernels cannot read keys stored in the block's RoPE frame (PagedConfig.kv_key_derotate="
                "True): read them with CompressedKV.read (the torch path), or set kv_key_derotate=False"
            )
        fmt, parts = self.format, self._group_parts(0)
        if not fmt.is_quantized:
            return parts["data"]
        return QuantizedKV(parts["data"], parts["scale"], fmt.name, parts.get("zero"), fmt.per_channel, fmt.per_head)
