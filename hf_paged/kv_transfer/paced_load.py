"""Paced loads: a waiting request's blocks written into the pool over several steps, each within its share.

Written all at once in the step that admits the request, a long prompt's handed-over blocks (tens of them) make
that step as long as a prefill chunk many times the step's prompt budget, and every request decoding beside it
waits. Here the request stays in the queue while its blocks go in a chunk a step, each chunk within the step's
share of prompt tokens, converted by the cost model (`TransferCostModel.block_tokens`: what writing one block on
the step's thread costs in tokens of this engine's prefill):

    share (blocks) = prompt tokens the step has left / block_tokens(block bytes)   (at least 1: a load moves on)

    prompt:   | cached here | written by earlier chunks | this step's chunk | later chunks | recomputed | last |
               0 ........................ hit            hit .. hit + n

A chunk: a staging table takes the local hit (the tree's blocks, earlier chunks included) and fresh blocks for the
chunk; the blobs are read (a store without background reads: only the chunk's) and written; the blocks go into the
prefix tree only then (the tree sees whole, written blocks); the staging table is dropped before the call returns.
So a waiting request holds no block between steps: its chunks are normal cached blocks (the newest: evicted last),
a tight pool may take them back (the request then hits fewer and recomputes the rest), and nothing waits on a
half-loaded request (no deadlock). A chunk that fails (a blob missing or corrupt, no room, a storage error, a gap in
the hit, new weights) ends the load, counted once: what was written stays cached, the rest is recomputed.

The prefix cache's hit counters keep meaning local hits: a chunk's staging lookup is not counted
(`RadixCache.counting` off), and when the request is admitted the tokens its load wrote are taken out of its
lookup's hit (`uncount`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hf_paged.kv_transfer.block_format import DecodedBlock
from hf_paged.kv_transfer.codec import ensure_storage
from hf_paged.kv_transfer.cost_model import work_clock
from hf_paged.kv_transfer.fetcher import BlockAsk, PendingFetch, read_blocks

__all__ = ["LoadStep", "PacedLoads", "StagedLoad"]


@dataclass(frozen=True, slots=True)
class LoadStep:
    """Admission's answer for a waiting request (`KVConnector.load_step`)."""

    waiting: bool  # its blocks are still being read or written: admit the others meanwhile
    num_tokens: int  # prompt tokens of the step's budget its block writes took (their cost in prefill tokens)


@dataclass(slots=True)
class StagedLoad:
    """A request's blocks being written, a chunk a step."""

    first: int  # table index of the first block of the load
    num_blocks: int  # blocks the store announced from `first` on
    epoch: int  # the prefix cache's epoch when asked: after a reset the blocks are stale
    blocks: list[DecodedBlock] | None = None  # read in the background already (from `first`), else None
    asks: list[BlockAsk] | None = None  # without a background read: the blobs to read, a chunk a step
    read_seconds: float = 0.0  # the background read's time, counted with the first chunk (cost model)
    num_written: int = 0  # blocks of the load the tree held after the last chunk


_STAGING = "kv-load"  # a chunk's staging table: (_STAGING, request id), dropped within the call


class PacedLoads:
    """The staged loads of one connector, keyed by request id (the scheduler's thread alone touches them)."""

    def __init__(self, connector) -> None:
        self.c = connector  # the `KVConnector` these loads belong to (not imported here: it imports this module)
        self._now = work_clock(next(connector.model.parameters()).device)  # the step clock's (`StepTimes` units)
        self._staged: dict[Hashable, StagedLoad] = {}
        self._written: dict[Hashable, tuple[int, int]] = {}  # ended loads: the prompt tokens (start, end) written

    def __len__(self) -> int:
        return len(self._staged)

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._staged

    def forget(self, seq_id: Hashable) -> None:
        self._staged.pop(seq_id, None)
        self._written.pop(seq_id, None)

    def uncount(self, seq_id: Hashable, num_hit_tokens: int) -> None:
        """The request's lookup hit `num_hit_tokens`: those its load wrote were not a local hit (take them out of the
        prefix cache's counters, which the request's own lookup just counted)."""
        start, end = self._written.pop(seq_id, (0, 0))
        loaded = max(0, min(num_hit_tokens, end) - start)
        radix = self.c.radix
        radix.num_hit_tokens -= loaded
        radix.num_hits -= bool(loaded) and loaded == num_hit_tokens

    def _lookup(self, staging: tuple, token_ids: Sequence[int], extra_keys: tuple) -> int:
        """The staging table's prefix hit, left out of the prefix cache's hit statistics (a load's bookkeeping)."""
        radix = self.c.radix
        radix.counting = False
        try:
            return self.c.kv.add_sequence(staging, token_ids, extra_keys)
        finally:
            radix.counting = True

    def share(self, token_budget: int | None, num_blocks: int) -> int:
        """Blocks a step with `token_budget` prompt tokens left may write (None: no bound), at least 1."""
        if token_budget is None:
            return num_blocks
        per_block = self.c.cost.block_tokens(self.c.block_bytes())
        return max(1, min(num_blocks, int(token_budget / per_block))) if per_block > 0 else num_blocks

    def step(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple,
             token_budget: int | None) -> LoadStep:
        c = self.c
        staged = self._staged.get(seq_id)
        if staged is None:
            if seq_id in c.fetcher:
                if not c.fetcher.is_done(seq_id):
                    return LoadStep(True, 0)
                staged = self._from_fetch(c.fetcher.take(seq_id))  # type: ignore[arg-type]
            elif c.load_async:
                started = c.start_read(seq_id, token_ids, extra_keys, c.kv.pool.num_blocks)
                return LoadStep(started, 0)
            else:
                staged = self._from_store(seq_id, token_ids, extra_keys)
            if staged is None:
                return LoadStep(False, 0)
            self._staged[seq_id] = staged
        return self._chunk(seq_id, staged, token_ids, extra_keys, token_budget)

    def _from_fetch(self, fetch: PendingFetch) -> StagedLoad:
        result = fetch.future.result()
        return StagedLoad(fetch.first, fetch.num_blocks, fetch.epoch, blocks=self.c.checked(result),
                          read_seconds=result.seconds)

    def _from_store(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple) -> StagedLoad | None:
        """Without background reads: the blocks the store holds past the local hit, to read a chunk a step."""
        c, bs = self.c, self.c.block_size
        limit = (len(token_ids) - 1) // bs
        if limit < 1 or c.skips(seq_id):
            return None
        digests = c.digests.digests(seq_id, token_ids[: limit * bs], extra_keys)
        first = c.radix.peek(token_ids[: limit * bs], extra_keys, digests) // bs
        held = c.num_external_blocks(token_ids, extra_keys, first * bs, digests)
        if not held or not c.worth_loading(seq_id, held):
            return None
        return StagedLoad(first, held, c.radix.epoch, asks=c.asks(digests, token_ids, first, held))

    def _chunk(self, seq_id: Hashable, staged: StagedLoad, token_ids: Sequence[int], extra_keys: tuple,
               token_budget: int | None) -> LoadStep:
        """Write this step's chunk of the load; the load ends when all is written or a chunk fails."""
        c, bs = self.c, self.c.block_size
        c.clock_cancel()  # the blocks this caches are not a forward's
        if staged.epoch != c.radix.epoch or not ensure_storage(c.cache, c.model):
            return self._end(seq_id, staged, failed=True, num_tokens=0)
        staging = (_STAGING, seq_id)
        start = self._now()  # the lookup (hashing the prompt) is the step's load work too
        hit = self._lookup(staging, token_ids, extra_keys) // bs
        try:
            done = hit - staged.first  # blocks of the load the tree holds (earlier chunks; maybe others' too)
            available = staged.num_blocks if staged.blocks is None else len(staged.blocks)
            if done < 0 or done >= available:  # a gap (blocks before the load were evicted), or all written
                return self._end(seq_id, staged, failed=done < 0 or available < staged.num_blocks, num_tokens=0)
            n = min(self.share(token_budget, available - done), c.kv.pool.num_free_blocks)
            if staged.asks is not None:  # read in the step: only this chunk's blobs
                blocks = c.checked(read_blocks(c.store, c.layout(), staged.asks[done : done + n]))
            else:
                blocks = staged.blocks[done : done + n]  # type: ignore[index]
            loaded = 0
            if (blocks and c.kv.allocate_slots(staging, len(blocks) * bs)
                    and c.write_blocks(c.kv.block_ids(staging)[hit : hit + len(blocks)], blocks)):
                loaded = len(blocks)  # only now, written, do they enter the prefix tree
                c.kv.cache_full_blocks(staging, token_ids[: (hit + loaded) * bs], extra_keys)
            seconds = self._now() - start
        finally:
            c.kv.free(staging)
        c.count_load(blocks[:loaded], seconds, seconds + staged.read_seconds)
        staged.num_written = done + loaded
        staged.read_seconds = 0.0
        used = 0 if token_budget is None else min(token_budget, math.ceil(n * c.cost.block_tokens(c.block_bytes())))
        if loaded < n or n == 0:
            return self._end(seq_id, staged, failed=True, num_tokens=used)
        if done + loaded >= available:
            return self._end(seq_id, staged, failed=available < staged.num_blocks, num_tokens=used)
        return LoadStep(True, used)

    def _end(self, seq_id: Hashable, staged: StagedLoad, *, failed: bool, num_tokens: int) -> LoadStep:
        """The load is over: the request goes on with what the tree holds, recomputing the rest."""
        del self._staged[seq_id]
        if staged.num_written > 0:
            bs = self.c.block_size
            self._written[seq_id] = (staged.first * bs, (staged.first + staged.num_written) * bs)
        self.c.settle(seq_id, failed=failed)
        return LoadStep(False, num_tokens)
