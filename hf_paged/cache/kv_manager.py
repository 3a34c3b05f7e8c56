"""Block tables of live sequences on top of the block pool: growth, sharing, copy-on-write, prefix hits.

A sequence is any hashable id (a request id in the engine, a batch row in the stock `cache=` path). The manager
knows token counts and block ids, never requests, queues or budgets (that is the scheduler's business).

    block table of one sequence (block_size 4, num_tokens 10)
    | b7: t0..t3 | b2: t4..t7 | b9: t8 t9 _ _ |
      full         full          partial: the only block that is ever written again
    A full block may be shared (ref_count > 1, prefix hits, forks); a shared partial block is copied before the
    next write (copy-on-write): the copy is queued in `pending_copies` for the storage owner to perform.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hf_paged.cache.block_pool import BlockPool
from hf_paged.errors import InvalidConfigError


@dataclass(slots=True)
class BlockCopy:
    """Storage copy the owner of the K/V tensors must perform before the next forward."""

    src_block_id: int
    dst_block_id: int


@dataclass(slots=True)
class SeqBlocks:
    """What the manager knows about one sequence."""

    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0  # slots claimed: tokens written or being written by the current forward
    num_cached_blocks: int = 0  # leading blocks already inserted into the prefix cache
    num_dropped_tokens: int = 0  # tokens dropped by token pruning: table position = logical position - this
    # leading blocks the prefix cache may take after pruning (None: all): a true token prefix (before the first
    # dropped block) whose K/V no pruned view wrote (PyramidKV's hiding: the blocks full when it began)
    num_prefix_blocks: int | None = None
    hidden: dict[int, list[int]] | None = None  # PyramidKV: layer -> table indices that layer must not see
    cache_epoch: int = 0  # prefix-cache epoch when the sequence started: K/V of an older epoch is never inserted
    row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # block_ids as int32 (`table_row`)
    num_in_row: int = 0  # leading entries of `row` equal to block_ids (a change before them lowers it)


class KVCacheManager:
    """Block tables over a `BlockPool`, with an optional prefix cache (`RadixCache`)."""

    def __init__(self, pool: BlockPool, block_size: int, prefix_cache=None) -> None:
        self.pool = pool
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.seqs: dict[Hashable, SeqBlocks] = {}
        self.pending_copies: list[BlockCopy] = []
        # `take_partial_block` may share a cached block a sequence uses only the start of (plain blocks: a
        # compressed layer's partial block must stay in its full-precision staging, so the paged cache turns it off)
        self.partial_reuse = True

    # -- queries ---------------------------------------------------------------------------------------
    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self.seqs

    def block_ids(self, seq_id: Hashable) -> list[int]:
        return self.seqs[seq_id].block_ids

    def table_row(self, seq_id: Hashable) -> np.ndarray:
        """The sequence's block table as an int32 array (a view, valid until the table changes). Kept beside the list
        and extended by what was appended since the last call: a step's block tables are built from these rows
        (a copy each), not from every list's ints again (3.7 ms CPU a step at 64 sequences of 2,048 blocks, 0.13 now:
        `benchmarks/host_overhead.py`)."""
        seq = self.seqs[seq_id]
        ids, done = seq.block_ids, seq.num_in_row
        if len(ids) > seq.row.shape[0]:
            grown = np.empty(max(len(ids), 2 * seq.row.shape[0], 16), np.int32)
            grown[:done] = seq.row[:done]
            seq.row = grown
        if len(ids) > done:
            seq.row[done : len(ids)] = ids[done:]
        seq.num_in_row = len(ids)
        return seq.row[: len(ids)]

    def num_tokens(self, seq_id: Hashable) -> int:
        return self.seqs[seq_id].num_tokens

    def blocks_needed(self, seq_id: Hashable, num_new_tokens: int) -> int:
        """Blocks `allocate_slots(seq_id, num_new_tokens)` would take from the pool (copy-on-write included)."""
        seq = self.seqs.get(seq_id)
        have_tokens = seq.num_tokens if seq else 0
        have_blocks = len(seq.block_ids) if seq else 0
        need = -(-(have_tokens + num_new_tokens) // self.block_size) - have_blocks
        if seq and num_new_tokens > 0 and self._last_block_needs_copy(seq):
            need += 1
        return max(need, 0)

    def num_dropped_tokens(self, seq_id: Hashable) -> int:
        return self.seqs[seq_id].num_dropped_tokens

    def slots(self, seq_id: Hashable, start: int, end: int) -> list[int]:
        """Flat slots of logical positions start .. end - 1 of a sequence (none of them dropped)."""
        seq, bs = self.seqs[seq_id], self.block_size
        table, shift = seq.block_ids, seq.num_dropped_tokens
        return [table[p // bs] * bs + p % bs for p in range(start - shift, end - shift)]

    def num_unused_slots(self) -> int:
        """Slots allocated but not holding a token (internal fragmentation), over live sequences."""
        return sum(len(s.block_ids) * self.block_size - s.num_tokens for s in self.seqs.values())

    def live_block_ids(self) -> set[int]:
        """Every block some live sequence's block table holds."""
        return {b for s in self.seqs.values() for b in s.block_ids}

    # -- mechanism -------------------------------------------------------------------------------------
    def add_sequence(self, seq_id: Hashable, token_ids: Sequence[int] = (), extra_keys: tuple = ()) -> int:
        """Register a sequence; with a prefix cache, take the longest cached prefix of `token_ids` (full blocks,
        always leaving at least the last token to compute). Returns the number of tokens served from cache."""
        if seq_id in self.seqs:
            raise KeyError(f"sequence {seq_id!r} is already registered")
        seq = SeqBlocks()
        self.seqs[seq_id] = seq
        if self.prefix_cache is not None:
            seq.cache_epoch = self.prefix_cache.epoch
        if self.prefix_cache is None or len(token_ids) < 2:
            return 0
        match = self.prefix_cache.match(token_ids[: len(token_ids) - 1], extra_keys)
        if match.num_tokens:
            self.pool.incref(match.block_ids)
            seq.block_ids = list(match.block_ids)
            seq.num_tokens = match.num_tokens
            seq.num_cached_blocks = len(match.block_ids)
        return match.num_tokens

    def take_partial_block(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple = ()) -> int:
        """Past a prefix hit of full blocks (`add_sequence`): the cached block that goes on with the most of the
        sequence's next tokens (never its last token: its logits are needed) becomes its last block, shared, and
        those tokens count as computed; the sequence's first write copies the block (copy-on-write), so the cache's
        block stays as it is. Reuse past the last full block, as SGLang's token tree gives, when it saves at least
        a quarter of a block (a prompt sharing only its first token or two with a cached one is not worth a copy).
        Returns the tokens."""
        seq = self.seqs[seq_id]
        start = seq.num_tokens
        if (not self.partial_reuse or self.prefix_cache is None or start != len(seq.block_ids) * self.block_size
                or len(token_ids) - 1 <= start):
            return 0
        block_id, n = self.prefix_cache.partial_block(seq.block_ids[-1] if seq.block_ids else None,
                                                      token_ids[start : len(token_ids) - 1], extra_keys)
        if n < max(2, self.block_size // 4):  # a block copy worth making: a quarter of a block, 2 tokens at least
            return 0
        self.pool.incref([block_id])
        seq.block_ids.append(block_id)
        seq.num_tokens += n
        return n

    def allocate_slots(self, seq_id: Hashable, num_new_tokens: int) -> bool:
        """Claim slots for `num_new_tokens` more tokens; False (and no change) when the pool cannot hold them."""
        seq = self.seqs[seq_id]
        need = self.blocks_needed(seq_id, num_new_tokens)
        if need and not self.pool.can_allocate(need):
            return False
        if num_new_tokens > 0 and self._last_block_needs_copy(seq):
            (new_block,) = self.pool.allocate(1)
            old_block = seq.block_ids[-1]
            self.pending_copies.append(BlockCopy(old_block, new_block))
            self.pool.free([old_block])
            seq.block_ids[-1] = new_block
            seq.num_in_row = min(seq.num_in_row, len(seq.block_ids) - 1)
            need -= 1
        if need:
            seq.block_ids.extend(self.pool.allocate(need))
        seq.num_tokens += num_new_tokens
        return True

    def fork(self, src_id: Hashable, dst_id: Hashable) -> None:
        """`dst` shares every block of `src` (its partial last block is copied on its first write)."""
        src = self.seqs[src_id]
        if dst_id in self.seqs:
            raise KeyError(f"sequence {dst_id!r} is already registered")
        self.pool.incref(src.block_ids)
        self.seqs[dst_id] = SeqBlocks(
            list(src.block_ids), src.num_tokens, src.num_cached_blocks, cache_epoch=src.cache_epoch,
            num_dropped_tokens=src.num_dropped_tokens, num_prefix_blocks=src.num_prefix_blocks, hidden=src.hidden,
        )

    def is_private(self, block_id: int) -> bool:
        """Held by one block table only and not in the prefix cache: dropping it frees it."""
        return self.pool.ref_counts[block_id] == 1 and not self.pool.is_cached(block_id)

    def drop_blocks(self, seq_id: Hashable, table_indices: Sequence[int]) -> None:
        """Drop full blocks from a sequence's table (token pruning); later positions move up the table. A shared
        block (another table's, the prefix cache's) only loses this table's reference: its K/V stay for the others.

            before: | b0 | b1 | b2 | b3 | b4: partial |   drop [1, 2]   after: | b0 | b3 | b4 |, dropped += 2 * bs
        """
        seq = self.seqs[seq_id]
        drop = sorted(set(table_indices))
        if not drop:
            return
        full = seq.num_tokens // self.block_size
        for i in drop:
            if not 0 <= i < full:
                raise ValueError(f"block {i} of sequence {seq_id!r} is not one of its {full} full blocks: "
                                 "only full blocks can be dropped")
        dropped = [seq.block_ids[i] for i in drop]
        gone = set(drop)
        seq.block_ids = [b for i, b in enumerate(seq.block_ids) if i not in gone]
        seq.num_in_row = min(seq.num_in_row, drop[0])
        seq.num_tokens -= len(drop) * self.block_size
        seq.num_dropped_tokens += len(drop) * self.block_size
        prefix = drop[0] if seq.num_prefix_blocks is None else min(seq.num_prefix_blocks, drop[0])
        seq.num_prefix_blocks = prefix
        seq.num_cached_blocks = min(seq.num_cached_blocks, prefix)
        self.pool.free(reversed(dropped))

    def hidden_blocks(self, seq_id: Hashable) -> dict[int, list[int]] | None:
        """PyramidKV: per layer, the table indices that layer must not see (None: none, or no such sequence)."""
        seq = self.seqs.get(seq_id)
        return seq.hidden if seq is not None else None

    def set_hidden_blocks(self, seq_id: Hashable, hidden: dict[int, list[int]] | None) -> None:
        """Set `hidden_blocks` (indices into the table as it is): forks share them, a free drops them. Once a layer
        hides a block, K/V written later come from a pruned view: the prefix cache takes only the blocks full now."""
        seq = self.seqs[seq_id]
        seq.hidden = hidden
        if hidden and any(hidden.values()):
            full = seq.num_tokens // self.block_size
            seq.num_prefix_blocks = full if seq.num_prefix_blocks is None else min(seq.num_prefix_blocks, full)
            seq.num_cached_blocks = min(seq.num_cached_blocks, seq.num_prefix_blocks)

    def end_prefix(self, seq_id: Hashable, position: int) -> None:
        """K/V from logical `position` on were not written by a plain prefill (sparse prefill attended that chunk
        block-sparsely; every later K/V depend on it): the prefix cache takes only the full blocks before it."""
        seq = self.seqs[seq_id]
        before = max(position - seq.num_dropped_tokens, 0) // self.block_size
        seq.num_prefix_blocks = before if seq.num_prefix_blocks is None else min(seq.num_prefix_blocks, before)
        seq.num_cached_blocks = min(seq.num_cached_blocks, seq.num_prefix_blocks)

    def prefix_blocks(self, seq_id: Hashable) -> int | None:
        """The leading blocks the prefix cache may take (None: all; `end_prefix`, pruning), e.g. for a swap."""
        return self.seqs[seq_id].num_prefix_blocks

    def restore_dropped(self, seq_id: Hashable, num_dropped_tokens: int,
                        hidden: dict[int, list[int]] | None = None, num_prefix_blocks: int | None = None) -> None:
        """A swapped-in sequence keeps the logical offset it had (its table is no longer a token prefix), the
        blocks its layers hid and the blocks the prefix cache may take (`prefix_blocks` when it was swapped out)."""
        seq = self.seqs[seq_id]
        seq.num_dropped_tokens, seq.hidden = num_dropped_tokens, hidden
        seq.num_prefix_blocks = num_prefix_blocks
        if num_dropped_tokens or (hidden and any(hidden.values())):
            seq.num_prefix_blocks = 0

    def truncate(self, seq_id: Hashable, num_tokens: int) -> None:
        """Keep only the first `num_tokens` tokens (freeing whole blocks past them)."""
        seq = self.seqs[seq_id]
        keep_blocks = -(-num_tokens // self.block_size)
        dropped = seq.block_ids[keep_blocks:]
        del seq.block_ids[keep_blocks:]
        seq.num_in_row = min(seq.num_in_row, keep_blocks)
        self.pool.free(reversed(dropped))
        seq.num_tokens = min(seq.num_tokens, num_tokens)
        # only whole kept blocks stay cached for this sequence: a kept partial block is copied on its next write
        # (it is the tree's), and that copy must be inserted once it fills again
        seq.num_cached_blocks = min(seq.num_cached_blocks, seq.num_tokens // self.block_size)

    def cache_tail(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple = ()) -> bool:
        """Before `free`: offer the sequence's last, partial block to the prefix cache (`RadixCache.insert_tail`)
        so a prompt that goes on from its tokens (a chat's next turn) copies them (`take_partial_block`).
        `token_ids`: its computed tokens. Only when its full blocks are all cached, nothing was pruned, and the
        tail is worth a copy (the `take_partial_block` threshold). Returns whether the tail was cached."""
        seq = self.seqs.get(seq_id)
        if seq is None or not self.partial_reuse or self.prefix_cache is None or seq.num_dropped_tokens \
                or seq.num_prefix_blocks is not None:
            return False
        n = min(len(token_ids), seq.num_tokens)
        full, tail = divmod(n, self.block_size)
        if tail < max(2, self.block_size // 4) or seq.num_cached_blocks != full or len(seq.block_ids) <= full:
            return False
        return self.prefix_cache.insert_tail(token_ids[:n], seq.block_ids[: full + 1], extra_keys,
                                             epoch=seq.cache_epoch)

    def free(self, seq_id: Hashable) -> None:
        """Give a sequence's blocks back, tail first (so LRU order evicts suffixes before prefixes)."""
        seq = self.seqs.pop(seq_id)
        self.pool.free(reversed(seq.block_ids))

    def has_uncached_full_blocks(self, seq_id: Hashable, num_computed: int) -> bool:
        """Whether `cache_full_blocks` could insert anything once `num_computed` tokens are written (a cheap test
        before building the token list: a block fills once every `block_size` decode steps)."""
        if self.prefix_cache is None:
            return False
        seq = self.seqs[seq_id]
        return min(num_computed, seq.num_tokens) // self.block_size > seq.num_cached_blocks

    def cache_full_blocks(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple = ()) -> None:
        """Insert the sequence's full, computed blocks into the prefix cache. `token_ids` are its tokens whose K/V
        are written (prompt and output so far); only complete blocks among them are inserted."""
        if self.prefix_cache is None:
            return
        seq = self.seqs[seq_id]
        num_full = min(len(token_ids), seq.num_tokens) // self.block_size
        if seq.num_prefix_blocks is not None:  # after pruning only the untouched leading blocks are a prefix
            num_full = min(num_full, seq.num_prefix_blocks)
        if num_full <= seq.num_cached_blocks:
            return
        self.prefix_cache.insert(token_ids[: num_full * self.block_size], seq.block_ids[:num_full], extra_keys,
                                 epoch=seq.cache_epoch, known=seq.num_cached_blocks)
        seq.num_cached_blocks = num_full

    def pin_prefix(self, token_ids: Sequence[int], extra_keys: tuple, max_share: float) -> int:
        """Keep the cached full blocks of a prefix out of eviction until `unpin_prefix` (or a weight change empties
        the cache); returns the tokens pinned: the full blocks of `token_ids` cached now (run a request with the
        prefix first). Pins hold pool room: at most `max_share` of the pool's blocks (`PagedConfig.
        prefix_pin_share`), beyond it `PrefixPinLimitError` with the numbers."""
        if self.prefix_cache is None:
            raise InvalidConfigError("pin_prefix needs the prefix cache: PagedConfig(enable_prefix_caching=True)")
        max_blocks = min(int(max_share * self.pool.num_blocks), self.pool.num_blocks - 1)  # one block stays unpinned
        return self.prefix_cache.pin(list(token_ids), extra_keys, max_blocks=max_blocks)

    def unpin_prefix(self, token_ids: Sequence[int], extra_keys: tuple) -> int:
        """Undo one `pin_prefix` of the longest pinned prefix of `token_ids`; returns its tokens (0: none)."""
        return self.prefix_cache.unpin(list(token_ids), extra_keys) if self.prefix_cache is not None else 0

    def take_pending_copies(self) -> list[BlockCopy]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def reset(self) -> None:
        """Forget every sequence (their blocks go back to the pool)."""
        for seq_id in list(self.seqs):
            self.free(seq_id)
        self.pending_copies.clear()

    def _last_block_needs_copy(self, seq: SeqBlocks) -> bool:
        if not seq.block_ids or seq.num_tokens % self.block_size == 0:
            return False
        last = seq.block_ids[-1]
        return self.pool.ref_counts[last] > 1 or self.pool.is_cached(last)

    # -- invariants ------------------------------------------------------------------------------------
    def expected_ref_counts(self) -> dict[int, int]:
        """References every block should have: one per block table holding it, plus the prefix cache's pins."""
        counts: dict[int, int] = dict(self.prefix_cache.pinned_ref_counts()) if self.prefix_cache is not None else {}
        for seq in self.seqs.values():
            for block_id in seq.block_ids:
                counts[block_id] = counts.get(block_id, 0) + 1
        return counts

    def check_integrity(self) -> None:
        for seq_id, seq in self.seqs.items():
            capacity = len(seq.block_ids) * self.block_size
            assert seq.num_tokens <= capacity, f"sequence {seq_id!r}: {seq.num_tokens} tokens in {capacity} slots"
            assert capacity - seq.num_tokens < self.block_size or seq.num_tokens == 0, (
                f"sequence {seq_id!r} holds a whole unused block"
            )
            assert seq.row[: seq.num_in_row].tolist() == seq.block_ids[: seq.num_in_row], (
                f"sequence {seq_id!r}: its table row was not marked stale where its block ids changed"
            )
        self.pool.check_integrity(self.expected_ref_counts())
        if self.prefix_cache is not None:
            self.prefix_cache.check_integrity()
