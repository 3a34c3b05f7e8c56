"""Pack the scheduled requests of one step into the inputs of one forward.

    request A: computed 0, runs 5 (prefill chunk)   request B: computed 9, runs 1 (decode)
    input_ids     a0 a1 a2 a3 a4 | b9
    positions      0  1  2  3  4 |  9
    query_start_loc  0 ........... 5 .. 6
    context_lens          5           10
    logits rows: B's only (A's prompt is not done: nothing to sample), unless A's chunk ends its prompt

    request C: computed 7, runs 1 + 2 drafts d0 d1 (speculative decode: its last token, then the drafts)
    input_ids   c7 d0 d1      positions 7 8 9      logits rows: all three (the model's choice after each)

    request S: scoring 3 targets of a 10-token prompt (score_start 7), computed 4, runs 6 (its last chunk)
    logits rows: positions 7 8 9, after every sampled row; S samples nothing and ends with this step
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hf_paged.batching.request import Request
from hf_paged.batching.scheduler import SchedulerOutput
from hf_paged.cache.kernels.cpu_warm import ready_variants
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.metadata import ObservedScores, PagedMetadata


@dataclass(frozen=True, slots=True)
class ScoredRows:
    """`count` consecutive logits rows of a scoring request, for its prompt positions `first` .. `first + count - 1`."""

    request: Request
    first: int
    count: int


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: list[int]
    positions: list[int]
    metadata: PagedMetadata
    logits_rows: list[int]  # packed rows whose logits are computed (1 + its drafts per sampled request)
    sampled_requests: list[Request]  # the requests of those rows, in the same order
    num_draft_tokens: list[int]  # drafted tokens of each sampled request (its rows: 1 + that many, consecutive)
    scored: list[ScoredRows]  # scoring requests' rows, after the sampled rows, in this order


def build_step_inputs(schedule: SchedulerOutput, kv: KVCacheManager, block_size: int,
                      attention_backend: str = "auto", observation_window: int = 0) -> StepInputs:
    """`observation_window` > 0: requests whose chunk runs some of their prompt's last `observation_window` queries
    get those queries' attention scored (SnapKV eviction reads `metadata.observed.scores` after the forward)."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc = [0]
    context_lens: list[int] = []
    tables: list[np.ndarray] = []
    logits_rows: list[int] = []
    sampled: list[Request] = []
    num_drafts: list[int] = []
    observed: dict[int, int] = {}
    scored: list[ScoredRows] = []
    score_offsets: list[int] = []  # each scored request's first row in the packed input
    for i, item in enumerate(schedule.scheduled):
        request, start, n, k = item.request, item.request.num_computed_tokens, item.num_tokens, item.num_draft_tokens
        end = start + n
        input_ids.extend(_token_slice(request, start, end - k))
        if k:
            input_ids.extend(request.draft_ids[:k])
        positions.extend(range(start, end))
        slots.extend(kv.slots(request.request_id, start, end))
        query_start_loc.append(query_start_loc[-1] + n)
        context_lens.append(end - kv.num_dropped_tokens(request.request_id))  # table positions, not logical
        prompt_len = len(request.prompt_ids)
        if observation_window and start < prompt_len and end > prompt_len - observation_window:
            # The prompt's last queries vote whichever chunk runs them (a query's scores see only the keys up to it):
            # a chunk ending inside the window scores its queries there, its last ones; the chunk that ends the
            # prompt its last min(window, n). `KVPruner` keeps the max over the chunks, so chunking changes nothing.
            window_start = max(start, prompt_len - observation_window)
            observed[i] = min(observation_window, n) if end >= prompt_len else end - window_start
        tables.append(kv.table_row(request.request_id))
        score_start = request.score_start
        if score_start is not None:  # scoring: rows of its scored positions in this chunk; it never samples
            first = max(start, score_start)
            if first < end:
                scored.append(ScoredRows(request, first, end - first))
                score_offsets.append(query_start_loc[-2] + first - start)
        elif end - k == request.num_tokens:
            logits_rows.extend(range(query_start_loc[-1] - 1 - k, query_start_loc[-1]))
            sampled.append(request)
            num_drafts.append(k)
    for rows, offset in zip(scored, score_offsets):
        logits_rows.extend(range(offset, offset + rows.count))
    metadata = PagedMetadata(
        slot_mapping=torch.from_numpy(np.array(slots, dtype=np.int64)),  # numpy parses a list of ints ~3x faster
        block_tables=_block_tables(tables),
        query_start_loc=query_start_loc,
        context_lens=context_lens,
        block_size=block_size,
        attention_backend=attention_backend,
        cpu_kernels=ready_variants(),
        observed=ObservedScores(observed),
    )
    return StepInputs(input_ids, positions, metadata, logits_rows, sampled, num_drafts, scored)


def _block_tables(tables: list[np.ndarray]) -> torch.Tensor:
    """[num_seqs, longest table] int32, rows padded with block 0 (never read: context lengths bound every read),
    copied from the manager's int32 rows (`table_row`): converting every table's ints again cost 130 us a table
    of 2,048 blocks, every step."""
    out = np.zeros((len(tables), max(t.shape[0] for t in tables)), dtype=np.int32)
    for row, table in zip(out, tables):
        row[: table.shape[0]] = table
    return torch.from_numpy(out)


def _token_slice(request: Request, start: int, end: int) -> list[int]:
    num_prompt = len(request.prompt_ids)
    if end <= num_prompt:
        return request.prompt_ids[start:end]
    if start >= num_prompt:
        return request.output_ids[start - num_prompt : end - num_prompt]
    return request.prompt_ids[start:] + request.output_ids[: end - num_prompt]
