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
a tight pool may take them back (the next chunk writes them again from the blocks read), and nothing waits on a
half-loaded request (no deadlock).

The step the background read finishes before (the reader thread's speed) must not decide what is loaded (issue 39:
a read taken while running requests held the pool ended its load with 0 blocks written, recomputed):
- no room: a chunk is written only when the free blocks hold the whole rest of the load (else its chunks would be
  evicted before the rest goes in). Until then the request waits (`LoadStep.blocked`: as for a request that does not
  fit, the scheduler admits none behind it) while running requests' tables hold blocks, which they give back as they
  end; with no table left (only pinned prefixes hold blocks: nothing will free one) it writes what fits and the rest
  is recomputed, a failure.
- a gap: blocks before the load's first were evicted meanwhile (to the store, the disk tier saving on eviction).
  The missing head is read again from the hit there is now and the blocks read are kept behind it (`_reask`); each
  re-read starts at a lower block, so they end.
A chunk that fails (a blob missing or corrupt, a storage error, new weights, a re-read the store cannot serve) ends
the load, counted once: what was written stays cached, the rest is recomputed.

The prefix cache's hit counters keep meaning local hits: a chunk's staging lookup is not counted
(`RadixCache.counting` off), and when the request is admitted the tokens its load wrote are taken out of its
lookup's hit (`uncount`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hf_paged.compat import execution_device
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
    blocked: bool = False  # waiting for a free block to write its next chunk into: admit none behind it (FCFS)


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
        self._now = work_clock(execution_device(connector.model))  # the step clock's (`StepTimes` units)
        self._staged: dict[Hashable, StagedLoad] = {}
        self._written: dict[Hashable, tuple[int, int]] = {}  # ended loads: the prompt tokens (start, end) written
        self._kept: dict[Hashable, StagedLoad] = {}  # a load whose head is read again (`_reask`): its blocks read

    def __len__(self) -> int:
        return len(self._staged)

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._staged

    def forget(self, seq_id: Hashable) -> None:
        self._staged.pop(seq_id, None)
        self._written.pop(seq_id, None)
        self._kept.pop(seq_id, None)

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
                staged = self._from_fetch(seq_id, c.fetcher.take(seq_id))  # type: ignore[arg-type]
            elif c.load_async:
                started = c.start_read(seq_id, token_ids, extra_keys, c.kv.pool.num_blocks)
                return LoadStep(started, 0)
            else:
                staged = self._from_store(seq_id, token_ids, extra_keys)
            if staged is None:
                return LoadStep(False, 0)
            self._staged[seq_id] = staged
        return self._chunk(seq_id, staged, token_ids, extra_keys, token_budget)

    def _from_fetch(self, seq_id: Hashable, fetch: PendingFetch) -> StagedLoad:
        """A finished read as a load; the read of a load's missing head (`_reask`) goes before the blocks kept."""
        result = fetch.future.result()
        blocks, num_blocks = self.c.checked(result), fetch.num_blocks
        kept = self._kept.pop(seq_id, None)
        if kept is not None and kept.epoch == fetch.epoch:
            num_blocks += kept.num_blocks  # what the store announced, both reads
            if fetch.first + len(blocks) == kept.first:  # the head came back whole: the kept blocks follow it
                blocks = blocks + kept.blocks  # type: ignore[operator]
        return StagedLoad(fetch.first, num_blocks, fetch.epoch, blocks=blocks, read_seconds=result.seconds)

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
        done = hit - staged.first  # blocks of the load the tree holds (earlier chunks; maybe others' too)
        if done < 0:  # a gap: blocks before the load were evicted meanwhile (to the store, as a rule)
            c.kv.free(staging)
            return self._reask(seq_id, staged, token_ids, extra_keys, token_budget)
        try:
            available = staged.num_blocks if staged.blocks is None else len(staged.blocks)
            if done >= available:  # all written (or held by the tree)
                return self._end(seq_id, staged, failed=available < staged.num_blocks, num_tokens=0)
            rest, free = available - done, c.kv.pool.num_free_blocks
            # the rest does not fit now (its chunks would be evicted before it ends): wait while requests' tables hold
            # blocks, which come back as they end (pinned prefixes' never do: with no table left, write what fits)
            waits = free < rest and any(seq.block_ids for sid, seq in c.kv.seqs.items() if sid != staging)
            n = 0 if waits else min(self.share(token_budget, rest), free)
            blocks, loaded = [], 0
            if n == 0:
                pass  # nothing to write this step
            elif staged.asks is not None:  # read in the step: only this chunk's blobs
                blocks = c.checked(read_blocks(c.store, c.layout(), staged.asks[done : done + n]))
            else:
                blocks = staged.blocks[done : done + n]  # type: ignore[index]
            if (blocks and c.kv.allocate_slots(staging, len(blocks) * bs)
                    and c.write_blocks(c.kv.block_ids(staging)[hit : hit + len(blocks)], blocks)):
                loaded = len(blocks)  # only now, written, do they enter the prefix tree
                c.kv.cache_full_blocks(staging, token_ids[: (hit + loaded) * bs], extra_keys)
            seconds = self._now() - start
        finally:
            c.kv.free(staging)
        if waits:  # the request stays queued, holding nothing; the blocks read stay with the load
            c.counters.load_waits += 1
            return LoadStep(True, 0, blocked=True)
        c.count_load(blocks[:loaded], seconds, seconds + staged.read_seconds)
        staged.num_written = done + loaded
        staged.read_seconds = 0.0
        used = 0 if token_budget is None else min(token_budget, math.ceil(n * c.cost.block_tokens(c.block_bytes())))
        if loaded < n or n == 0:
            return self._end(seq_id, staged, failed=True, num_tokens=used)
        if done + loaded >= available:
            return self._end(seq_id, staged, failed=available < staged.num_blocks, num_tokens=used)
        return LoadStep(True, used)

    def _reask(self, seq_id: Hashable, staged: StagedLoad, token_ids: Sequence[int], extra_keys: tuple,
               token_budget: int | None) -> LoadStep:
        """The local hit the load was asked after shrank: a tight pool evicted blocks before the load's first while its
        read ran or it waited for room (a slow read waits longer: issue 39). The evicted blocks went to the store (the
        disk tier saves on eviction): read them again, from the hit there is now, and keep the blocks already read
        behind them. Each time the load starts at a smaller block (the hit now, below the load's first), so this ends."""
        c = self.c
        del self._staged[seq_id]
        c.counters.reread_loads += 1
        if c.load_async and staged.blocks is not None:
            prefix = token_ids[: staged.first * c.block_size]
            first = c.radix.peek(prefix, extra_keys, c.digests.digests(seq_id, prefix, extra_keys)) // c.block_size
            if c.start_read(seq_id, token_ids, extra_keys, staged.first - first):  # the missing head alone
                self._kept[seq_id] = staged
                return LoadStep(True, 0)
        elif not c.load_async and (again := self._from_store(seq_id, token_ids, extra_keys)) is not None:
            self._staged[seq_id] = again  # read in the step, a chunk a step: only what is missing is read
            return self._chunk(seq_id, again, token_ids, extra_keys, token_budget)
        return self._end(seq_id, staged, failed=True, num_tokens=0)

    def _end(self, seq_id: Hashable, staged: StagedLoad, *, failed: bool, num_tokens: int) -> LoadStep:
        """The load is over: the request goes on with what the tree holds, recomputing the rest."""
        self._staged.pop(seq_id, None)
        if staged.num_written > 0:
            bs = self.c.block_size
            self._written[seq_id] = (staged.first * bs, (staged.first + staged.num_written) * bs)
        self.c.settle(seq_id, failed=failed)
        return LoadStep(False, num_tokens)
