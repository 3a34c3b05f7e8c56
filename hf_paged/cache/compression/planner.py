"""`CompressedPlanner`: what the compressed layers of one cache share, and the plan of each step.

Every `CompressedLayer` keeps its own tensors (quantized blocks, staging rows, streaming slots), but which staging
row holds a partially written block (`StagingMap`) and which slot holds a streaming head's block (`SlotMap`) is the
same in every layer. The planner owns those two maps and turns a step's block tables into a `StepPlan` once, before
any layer writes, so every layer applies the same plan:

    engine step:  metadata.block_tables -> step_plan_of(metadata) -> kept for that metadata (built by layer 0)
    stock step:   rows' block tables   -> stock_step_plan(...)    -> kept until the next step's first layer

Each plan is kept here, the bookkeeping the layers share, never written into the step's metadata; a layer returns
the plan to attention inside its `CompressedBlocks` (`layer_kv`).

See `blocks` for the block life cycle and what a query reads, `streaming_heads` for the streaming slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from hf_paged.cache.compression.blocks import SeqSpan, StagingMap, StepPlan, plan_step
from hf_paged.cache.compression.spec import CompressionSpec
from hf_paged.cache.compression.streaming_heads import SlotMap, plan_stream_step
from hf_paged.cache.kv_manager import BlockCopy, KVCacheManager
from hf_paged.cache.metadata import PagedMetadata


@dataclass(slots=True, frozen=True)
class StagingCopy:
    """Copy-on-write of a partially written block's staging row, in every compressed layer."""

    src_row: int
    dst_row: int
    num_rows: int  # staging rows the layers hold before copying (the map's high water after this assignment)


class CompressedPlanner:
    """Staging-row and streaming-slot maps shared by a cache's compressed layers, and their step plans."""

    def __init__(self, spec: CompressionSpec, num_blocks: int, manager: KVCacheManager) -> None:
        cfg = spec.cfg
        self.spec = spec
        self.num_blocks = num_blocks
        self.block_size = spec.block_size
        self.manager = manager
        # One partial block per live sequence at most; reclaimed and grown on demand (forks, beams).
        self.staging = StagingMap(min(cfg.max_num_seqs, num_blocks) + 2)
        per_seq = spec.slots_per_seq
        self.slots = SlotMap(min(cfg.max_num_seqs * per_seq, 4 * per_seq, num_blocks))
        self._stock_plan: StepPlan | None = None  # the stock path's current step (built by its first layer)
        self._engine_step: tuple[PagedMetadata, StepPlan] | None = None  # the engine's current step and its plan

    def plan(self, spans: list[SeqSpan]) -> StepPlan:
        """Assign staging rows (and streaming slots) for a step writing `spans`, and plan its writes and reads."""
        plan = plan_step(spans, self.block_size, self.staging, self.manager.live_block_ids)
        if self.spec.has_streaming_heads:
            live = {k: (s.block_ids, s.num_tokens) for k, s in self.manager.seqs.items()}
            heads = self.spec.cfg.kv_streaming_heads or ()
            plan.stream = plan_stream_step(self.slots, live, plan.full_ids.tolist(), plan.ref_full_ids.tolist(),
                                           self.block_size, heads, self.spec.sink_blocks, self.spec.window_blocks)
        return plan

    def step_plan_of(self, metadata: PagedMetadata) -> StepPlan:
        """The engine step's plan, built at the first layer and shared by the others (one per `metadata`)."""
        if self._engine_step is not None and self._engine_step[0] is metadata:
            return self._engine_step[1]
        tables = metadata.block_tables.tolist()
        spans = []
        for i, context_len in enumerate(metadata.context_lens):
            q_len = metadata.query_start_loc[i + 1] - metadata.query_start_loc[i]
            table = tables[i][: -(-context_len // self.block_size)]
            spans.append(SeqSpan(table, context_len - q_len, context_len))
        plan = self.plan(spans)
        self._engine_step = (metadata, plan)
        return plan

    def stock_step_plan(self, num_rows: int, start: int, end: int, *, new_step: bool) -> StepPlan:
        """The stock path's plan: rows 0 .. num_rows-1 (sequences of the manager) write positions start .. end-1.
        Built by the step's first layer (`new_step`), reused by the others."""
        if new_step or self._stock_plan is None:
            spans = [SeqSpan(self.manager.block_ids(r), start, end) for r in range(num_rows)]
            self._stock_plan = self.plan(spans)
        return self._stock_plan

    def staging_copies(self, copies: list[BlockCopy]) -> list[StagingCopy]:
        """Copy-on-write of partial blocks: each copy of a staged block gets its own staging row. Every layer
        copies the rows' contents in the order returned."""
        staged = []
        for copy in copies:
            src_row = self.staging.rows.get(copy.src_block_id)
            if src_row is not None:
                dst_row = self.staging.assign(copy.dst_block_id, partial(self._live_and, [copy.src_block_id]))
                staged.append(StagingCopy(src_row, dst_row, self.staging.high_water))
        return staged

    def staging_row_for_load(self, block_id: int, block_ids: list[int]) -> int:
        """Swap in: the staging row of `block_id`, one of the fresh blocks `block_ids` being loaded."""
        return self.staging.assign(block_id, partial(self._live_and, block_ids))

    def _live_and(self, block_ids: list[int]) -> set[int]:
        """Blocks whose staging rows a reclaim must keep: the live tables' blocks and `block_ids`."""
        return self.manager.live_block_ids() | set(block_ids)

    def live_slots(self) -> int:
        """Streaming-store slots held by blocks of live block tables."""
        live = self.manager.live_block_ids()
        return sum(1 for b in self.slots.rows if b in live)
