"""`StockRows`: the batch rows of the stock `cache=` path, shared by every layer of a `PagedCache`.

Stock `generate` hands the cache dense `[batch, kv_heads, q_len, head_dim]` K/V, one layer after the other. Row r of
the batch is sequence r of the cache's `KVCacheManager`; the first layer to see a step's tokens claims their slots
for every layer (copy-on-write copies applied at once, in every layer), the others find them claimed.

    during a step that adds q tokens to every row (4 layers; layers 0-1 have stored theirs, 2-3 not yet)
    row_len per layer   | start+q | start+q | start | start |
    slots claimed       start+q in every row (by layer 0: row_len[0] was start == what was claimed then)
    layer 2's update    row_len[2] == start < claimed: the slots are there, only written now

Beam search and batch selection remap rows onto each other's block tables (shared blocks, copy-on-write), never
copying K/V.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.sizing import out_of_blocks
from hf_paged.config import PagedConfig


@dataclass(slots=True, frozen=True)
class StockWrite:
    """Where one layer's update of the stock path writes, in every row."""

    start: int  # tokens each row held in this layer before the update
    end: int  # after it
    new_step: bool  # this layer is the first to see the step's tokens (it claimed their slots for every layer)


class StockRows:
    """Rows 0 .. num_rows-1 of the stock path as sequences of `manager`, and the tokens each layer stored.

    `apply_copies` performs the manager's pending copy-on-write copies in every layer (the cache's
    `apply_pending_copies`); it runs right after a claim, before any layer writes the claimed slots."""

    def __init__(self, manager: KVCacheManager, num_layers: int, cfg: PagedConfig,
                 apply_copies: Callable[[], None]) -> None:
        self.manager = manager
        self.cfg = cfg
        self.apply_copies = apply_copies
        self.num_rows = 0  # batch rows (sequence ids 0 .. num_rows-1)
        self.row_len: list[int] = [0] * num_layers  # tokens stored per layer (the same in every row)

    def seq_length(self, layer_idx: int) -> int:
        return self.row_len[layer_idx]

    def begin(self, layer_idx: int, batch: int, q_len: int) -> StockWrite:
        """Claim (first layer of a step) or find the slots of `q_len` new tokens in each of `batch` rows."""
        self._check_supported()
        start = self.row_len[layer_idx]
        if start == 0 and layer_idx == 0:
            self._start(batch)
        if batch != self.num_rows:
            raise ValueError(f"PagedCache holds {self.num_rows} rows but got a batch of {batch}; use a new cache")
        new_step = start == self._max_claimed()
        if new_step:
            self._claim(q_len)  # first layer to see this step's tokens claims their slots for every layer
        self.row_len[layer_idx] = start + q_len
        return StockWrite(start, start + q_len, new_step)

    def slots(self, start: int, end: int) -> torch.Tensor:
        """`[num_rows, end - start]` flat slots of positions start .. end - 1 of every row."""
        return torch.tensor([self.manager.slots(r, start, end) for r in range(self.num_rows)], dtype=torch.long)

    def block_ids(self, row: int) -> list[int]:
        return self.manager.block_ids(row)

    def remap(self, sources: list[int]) -> None:
        """Row i takes the history of row `sources[i]` (block tables forked: shared blocks, copy-on-write)."""
        if not self.num_rows:
            return
        tmp: list[Hashable] = [("old", r) for r in range(self.num_rows)]
        for r in range(self.num_rows):
            self.manager.fork(r, tmp[r])
            self.manager.free(r)
        for new_row, src in enumerate(sources):
            self.manager.fork(tmp[src], new_row)
        for t in tmp:
            self.manager.free(t)
        self.num_rows = len(sources)

    def truncate(self, keep: int) -> None:
        """Keep the first `keep` tokens of every row, in every layer."""
        for r in range(self.num_rows):
            self.manager.truncate(r, keep)
        self.row_len = [min(n, keep) for n in self.row_len]

    def reset(self) -> None:
        self.manager.reset()
        self.num_rows = 0
        self.row_len = [0] * len(self.row_len)

    def _start(self, batch: int) -> None:
        self.manager.reset()
        self.num_rows = batch
        for r in range(batch):
            self.manager.add_sequence(r)

    def _max_claimed(self) -> int:
        return self.manager.num_tokens(0) if self.num_rows else 0

    def _claim(self, q_len: int) -> None:
        manager = self.manager
        need = sum(manager.blocks_needed(r, q_len) for r in range(self.num_rows))
        if not manager.pool.can_allocate(need):
            raise out_of_blocks(need, manager.pool.num_free_blocks, manager.pool.num_blocks, manager.block_size)
        for r in range(self.num_rows):
            manager.allocate_slots(r, q_len)
        self.apply_copies()

    def _check_supported(self) -> None:
        if self.cfg.kv_pruning is not None:
            raise ValueError(
                f"PagedConfig.kv_pruning={self.cfg.kv_pruning!r} needs the hf_paged attention (it scores "
                "and drops blocks the stock attention cannot see); allowed on the stock cache= path: None. Use "
                "hf_paged.wrap(model, config) so generate runs on the engine"
            )
        if self.cfg.kv_streaming_heads and any(self.cfg.kv_streaming_heads):
            raise ValueError(
                "PagedConfig.kv_streaming_heads needs the hf_paged attention (stock attention cannot restrict some "
                "heads to sinks + window); allowed on the stock cache= path: None. Use hf_paged.wrap(model, config) "
                "so generate runs on the engine"
            )
        if self.cfg.sparse_prefill is not None:
            raise ValueError(
                f"PagedConfig.sparse_prefill={self.cfg.sparse_prefill!r} needs the hf_paged attention (stock attention "
                "attends every key densely, so it would run as if unset); allowed on the stock cache= path: None. Use "
                "hf_paged.wrap(model, config) so generate runs on the engine"
            )
