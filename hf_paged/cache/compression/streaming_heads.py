"""Streaming heads (DuoAttention): KV heads that keep only attention sinks plus a recent window, in a small store.

`PagedConfig.kv_streaming_heads` names, per layer, KV heads whose queries only need the first tokens (sinks) and
the recent ones. Their K/V live apart from the block storage, in a per-layer store of slots reached through a
`SlotMap` (block id -> slot, shared by every layer). A block has a slot only while it is full and, in some live
block table, a sink block or inside the window; the other heads (retrieval heads) keep every block as usual.

    a sequence's table after a step (block_size 4, sinks 4 -> 1 sink block, window 8 -> 2 window blocks)
    | b3 | b8 | b1 | b6 | b2 | b5 | b9: t24 t25 _ _ |
      sink   released      window     partial: staging row (every head, model dtype), never a slot
      slot                 slots

What a streaming head's query at position q sees (whatever the chunking, so results do not depend on it): keys in
the sink blocks (table index < ceil(num_sink_tokens / block_size)) and in blocks q // block_size - window_blocks
.. q // block_size (window_blocks = ceil(window_tokens / block_size)), causally. Over a step the store therefore
holds, per sequence, those blocks for the step's first query; a block leaving every window is released when the
next step is planned (after every layer of this step has read it), and a released slot is only reassigned from
that next plan on. Blocks that fill and leave the window within one step (a long prefill chunk) never get a slot:
that step's queries read them from the quantize -> dequantize round trip made when they filled.
RoPE positions are logical positions (keys are stored rotated); nothing is renumbered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from hf_paged.cache.kernels.reference import AttentionPlan, PrefillGroup, run_attention_plan


def held_table_indices(num_tokens: int, block_size: int, sink_blocks: int, window_blocks: int) -> list[int]:
    """Table indices of the full blocks a sequence of `num_tokens` tokens keeps for its streaming heads."""
    full = num_tokens // block_size
    first_window = max(0, num_tokens // block_size - window_blocks)
    return [i for i in range(full) if i < sink_blocks or i >= first_window]


def visible_keys(query_pos: torch.Tensor, key_pos: torch.Tensor, block_size: int, sink_blocks: int,
                 window_blocks: int) -> torch.Tensor:
    """`[q, k]` bool: key positions a streaming head's queries see (causality is applied by the caller)."""
    key_block, query_block = key_pos[None, :] // block_size, query_pos[:, None] // block_size
    return (key_block < sink_blocks) | (key_block >= query_block - window_blocks)


class SlotMap:
    """Block id -> slot of the streaming store. Grows on demand; `plan` keeps exactly the blocks still needed."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: dict[int, int] = {}
        self.free_rows: list[int] = list(range(capacity - 1, -1, -1))

    def plan(self, required: set[int], new_ids: Iterable[int], live: set[int]) -> None:
        """Give a slot to every block of `new_ids` in `required` that has none, then release the slots of blocks
        not in `required`. Slots of blocks no live table holds (`live`) are free at once; those of blocks that
        left a window are reassigned only by a later plan, since this step's queries may still read them."""
        for block_id in [b for b in self.rows if b not in live]:
            self.free_rows.append(self.rows.pop(block_id))
        release = [b for b in self.rows if b not in required]
        for block_id in new_ids:
            if block_id in required and block_id not in self.rows:
                if not self.free_rows:
                    grown = max(4, self.capacity)
                    self.free_rows = list(range(self.capacity + grown - 1, self.capacity - 1, -1))
                    self.capacity += grown
                self.rows[block_id] = self.free_rows.pop()
        for block_id in release:
            self.free_rows.append(self.rows.pop(block_id))


@dataclass(slots=True)
class StreamStep:
    """Where one step's streaming-head K/V are written and read (shared by every layer).

    Indices refer to the `StepPlan`: `full_ids` (blocks quantized this step) and `ref_full_ids` (full blocks the
    step reads). A referenced block comes from this step's round trip when it filled now, else from its slot,
    else (released: no query of the step sees it) it reads as zeros."""

    heads: tuple[tuple[int, ...], ...]  # per layer, the streaming KV heads
    sink_blocks: int
    window_blocks: int
    write_pos: torch.Tensor  # indices into full_ids of the blocks that keep a slot
    write_slots: torch.Tensor  # their slots
    ref_slot_pos: torch.Tensor  # indices into ref_full_ids read from a slot
    ref_slots: torch.Tensor
    ref_fresh_pos: torch.Tensor  # indices into ref_full_ids quantized this step
    ref_fresh_rows: torch.Tensor  # their indices into full_ids
    plans: dict = field(default_factory=dict)  # streaming attention plans per (device, sliding_window)

    def layer_heads(self, layer_idx: int) -> tuple[int, ...]:
        return self.heads[layer_idx] if layer_idx < len(self.heads) else ()


def plan_stream_step(slot_map: SlotMap, live: dict, full_ids: list[int], ref_full_ids: list[int], block_size: int,
                     heads: tuple[tuple[int, ...], ...], sink_blocks: int, window_blocks: int) -> StreamStep:
    """Assign and release slots for a step. `live`: every live sequence's (block ids, tokens after this step)."""
    required: set[int] = set()
    live_blocks: set[int] = set()
    for block_ids, num_tokens in live.values():
        required.update(block_ids[i] for i in held_table_indices(num_tokens, block_size, sink_blocks, window_blocks))
        live_blocks.update(block_ids)
    read_slots = dict(slot_map.rows)  # before the release: this step may still read released blocks
    slot_map.plan(required, full_ids, live_blocks)
    write = [(j, slot_map.rows[b]) for j, b in enumerate(full_ids) if b in slot_map.rows]
    fresh_row = {b: j for j, b in enumerate(full_ids)}
    fresh = [(j, fresh_row[b]) for j, b in enumerate(ref_full_ids) if b in fresh_row]
    slots = [(j, read_slots[b]) for j, b in enumerate(ref_full_ids) if b not in fresh_row and b in read_slots]
    return StreamStep(heads, sink_blocks, window_blocks, *_pairs(write), *_pairs(slots), *_pairs(fresh))


def write_streaming_heads(stream: tuple, slot_parts: dict, step: StreamStep, full: torch.Tensor,
                          dtype: torch.dtype) -> torch.Tensor:
    """Quantize the streaming heads of this step's full blocks `[n, bs, H, D]`; the ones still held go to their
    slots. Returns all of them dequantized: this step's reads take them from there (a block that filled and left
    the window within the step has no slot)."""
    heads, fmt = stream
    quantized = fmt.quantize(full[:, :, heads.to(full.device)])
    if step.write_pos.numel():
        pos, slots = step.write_pos.to(full.device), step.write_slots.to(full.device)
        for name, t in slot_parts.items():
            t[slots] = quantized[name][pos].to(t.dtype)
    return fmt.dequantize(quantized, dtype)


def read_streaming_heads(stream: tuple, slot_parts: dict, step: StreamStep, full: torch.Tensor,
                         fresh: torch.Tensor | None, dtype: torch.dtype) -> None:
    """Fill the streaming heads of the step's referenced full blocks `full` `[n, bs, H, D]` in place: from this
    step's round trip (`fresh`), else from their slots, else zeros (released: no query of the step sees them)."""
    heads, fmt = stream
    device = full.device
    x = full.new_zeros((full.shape[0], full.shape[1], heads.numel(), full.shape[3]))
    if step.ref_slot_pos.numel():
        parts = {n: t.index_select(0, step.ref_slots.to(device)) for n, t in slot_parts.items()}
        x[step.ref_slot_pos.to(device)] = fmt.dequantize(parts, dtype)
    if step.ref_fresh_pos.numel():
        x[step.ref_fresh_pos.to(device)] = fresh[step.ref_fresh_rows.to(device)]
    full[:, :, heads.to(device)] = x


def _pairs(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.tensor([p[0] for p in pairs], dtype=torch.long)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    return a, b


def streaming_plan(base: AttentionPlan, stream: StreamStep, spans, virtual_tables: list[list[int]],
                   block_size: int, device: torch.device, sliding_window: int | None = None) -> AttentionPlan:
    """The step's attention plan as the streaming heads see it (`base`: the plan of the other heads).

    Prefill chunks keep their groups with the main keys' mask restricted to sinks + window; each decode becomes a
    one-query group gathering only its visible keys."""
    bs, sinks, window = block_size, stream.sink_blocks, stream.window_blocks
    prefills = []
    groups = iter(base.prefills)
    for span in spans:
        if span.end - span.start <= 1:
            continue
        group = next(groups)
        query_pos = torch.arange(span.start, span.end, device=device)
        see = visible_keys(query_pos, torch.arange(span.end, device=device), bs, sinks, window)
        mask = group.mask.clone()
        mask[:, : span.end] &= see  # the first `end` columns are the main keys in table order; the rest are
        prefills.append(PrefillGroup(group.q_start, group.q_end, group.slots, mask))  # the query's own block
    q_start = 0
    for span, table in zip(spans, virtual_tables):
        if span.end - span.start == 1:
            held = held_table_indices(span.end - 1, bs, sinks, window)  # full blocks before the query's own
            own = list(range((span.end - 1) // bs * bs, span.end))
            positions = torch.tensor([p for i in held for p in range(i * bs, (i + 1) * bs)] + own, dtype=torch.long)
            if sliding_window is not None:  # the model's own sliding window still applies (sinks included)
                positions = positions[positions > span.end - 1 - sliding_window]
            rows = torch.tensor(table, dtype=torch.long)[positions // bs]
            slots = (rows * bs + positions % bs).to(device)
            mask = torch.ones((1, slots.numel()), dtype=torch.bool, device=device)
            prefills.append(PrefillGroup(q_start, q_start + 1, slots, mask))
        q_start += span.end - span.start
    return AttentionPlan(base.num_query_tokens, prefills, [])


def split_attention(layer_heads: tuple[int, ...], base: AttentionPlan, stream_plan: AttentionPlan,
                    q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float,
                    softcap: float | None) -> torch.Tensor:
    """Attention with the streaming KV heads `layer_heads` under `stream_plan` and the others under `base`.
    q `[T, H, D]`; key/value read buffers `[n, bs, H_kv, D]`."""
    num_kv_heads, group = key.shape[-2], q.shape[1] // key.shape[-2]
    out = torch.empty_like(q)
    streaming = torch.tensor(layer_heads, dtype=torch.long, device=q.device)
    others = torch.tensor([h for h in range(num_kv_heads) if h not in layer_heads], dtype=torch.long,
                          device=q.device)
    for kv_heads, plan in ((others, base), (streaming, stream_plan)):
        if not kv_heads.numel():
            continue
        q_heads = (kv_heads[:, None] * group + torch.arange(group, device=q.device)).reshape(-1)
        out[:, q_heads] = run_attention_plan(plan, q[:, q_heads], key.index_select(2, kv_heads),
                                             value.index_select(2, kv_heads), scale=scale, softcap=softcap)
    return out
