"""The connector's save half: full blocks the prefix tree stores or evicts, copied out and handed to the store.

    the tree's BlockSink call (inside an insert or an eviction, on the step thread)
        -> save_blocks: CPU copies of the blocks' K/V, before the pool can reuse them (the only work that must
           happen there)
        -> write-behind store: queued, encoded and written by its thread (`write_behind.py`), or dropped and
           counted when its queue is full
        -> any other store: encoded and put now (an in-process store: memory copies another engine reads at once)

A save is an optimisation: one that fails or is dropped costs only a later recompute, and never fails the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.tree_nodes import TreeNode
from hf_paged.kv_transfer.block_format import encode_block
from hf_paged.kv_transfer.codec import block_tensors, is_transferable
from hf_paged.kv_transfer.failure_log import FailureLog
from hf_paged.kv_transfer.layout import BlockLayout
from hf_paged.kv_transfer.stores import KVStore
from hf_paged.kv_transfer.write_behind import WriteBehindStore

__all__ = ["BlockSaver"]

_HEADER_BYTES = 512  # about what a block's header adds to its tensors (counted against the write queue)


class BlockSaver:
    """Saves tree nodes' blocks into `store`; through `writer` (a `WriteBehindStore` over `store`) when given.

    `counters` is the connector's `KVTransferStats` (saved_*, save_failures, save_seconds: the step thread's part)."""

    def __init__(self, cache: PagedCache, store: KVStore, writer: WriteBehindStore | None,
                 layout: Callable[[], BlockLayout], keys: Callable[[Sequence[bytes]], list[bytes]], counters) -> None:
        self.cache, self.store, self.writer = cache, store, writer
        self._layout, self._keys, self.counters = layout, keys, counters
        self.failures = FailureLog(f"KV saves to the {getattr(store, 'name', type(store).__name__)} store")

    def save(self, nodes: Sequence[TreeNode], *, wait: bool = False) -> int:
        """Save full cached blocks (tree nodes: digest, block id, token ids) the store does not hold yet; returns
        how many were written (or queued, with a writer and not `wait`)."""
        start = time.perf_counter()
        layout = self._layout()
        front = self.store if wait or self.writer is None else self.writer
        todo = [(n, key) for n, key in zip(nodes, self._keys([n.digest for n in nodes]))  # type: ignore[misc]
                if not front.contains(key)]
        if not todo:
            return 0
        saved = self.cache.save_blocks([n.block_id for n, _ in todo])
        if not is_transferable(saved):
            return 0
        done = 0
        for i, (node, key) in enumerate(todo):
            tensors = block_tensors(saved, i)
            make = partial(encode_block, layout, node.digest, tuple(node.token_ids), tensors)  # type: ignore[arg-type]
            if front is self.writer:
                size = sum(t.numel() * t.element_size() for _, t in tensors) + _HEADER_BYTES
                done += self.writer.put_deferred(key, make, size)  # counted by the writer once written
                continue
            blob = make()
            if front.put(key, blob):
                done += 1
                self.counters.saved_blocks += 1
                self.counters.saved_bytes += len(blob)
            else:
                self.counters.save_failures += 1
                self.failures.record("save", f"the store refused a {len(blob):,}-byte block (over its bound, or a "
                                             "storage error)")
        self.counters.save_seconds += time.perf_counter() - start
        return done

    def save_quietly(self, nodes: Sequence[TreeNode]) -> None:
        # Called from inside the tree's insert and eviction: an error here must not leave the tree and the pool
        # half updated. A block that could not be saved is only a block a later hit recomputes.
        try:
            self.save(nodes)
        except Exception as exc:  # noqa: BLE001 -- counted and logged once; the engine goes on without the copy
            self.counters.save_failures += 1
            self.failures.record("save", repr(exc))

    def stats(self) -> dict[str, float]:
        """The writer's part of the counters (blocks it wrote count as saved)."""
        if self.writer is None:
            return {}
        w = self.writer.counters
        return {"saved_blocks": self.counters.saved_blocks + w.written_blocks,
                "saved_bytes": self.counters.saved_bytes + w.written_bytes,
                "save_failures": self.counters.save_failures + w.write_failures,
                "save_dropped": w.dropped_blocks, "write_seconds": w.write_seconds,
                "save_queued_blocks": self.writer.queued_blocks}

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued writes (True: none left)."""
        return self.writer.flush(timeout) if self.writer is not None else True

    def close(self, *, flush: bool = True) -> None:
        if self.writer is not None:
            self.writer.close(flush=flush)
