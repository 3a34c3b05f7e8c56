"""`KVTransferStats`: the counters of one `KVConnector` (`Engine.stats()` shows them as `kv_transfer_<name>`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

_LOG = logging.getLogger("hf_paged")

__all__ = ["KVTransferStats"]


@dataclass(slots=True)
class KVTransferStats:
    """Counters of one connector (`Engine.stats()` shows them as `kv_transfer_<name>`)."""

    loaded_blocks: int = 0  # blocks loaded into the pool instead of recomputed
    loaded_bytes: int = 0
    loaded_tokens: int = 0  # prompt tokens those blocks hold: prefill tokens not computed
    fetch_seconds: float = 0.0  # reading and checking blobs (in the admitting step, or in the worker thread)
    load_seconds: float = 0.0  # the step's part of loads: a read there, writing into the pool and the prefix tree
    load_failures: int = 0  # loads that fell short of what the store announced (then recomputed)
    rejected_blocks: int = 0  # blobs refused (corrupt, another layout) and deleted
    saved_blocks: int = 0  # blocks written to the store
    saved_bytes: int = 0
    save_failures: int = 0  # saves that raised (the blocks stay where they were: only the copy is missing)
    save_seconds: float = 0.0  # the step thread's part of saving: copying (and, without a writer, encoding, writing)
    save_dropped: int = 0  # saves refused because the write queue was full (a write-behind store)
    save_queued_blocks: int = 0  # blocks queued for writing now
    write_seconds: float = 0.0  # encoding and writing in the writer thread (a write-behind store)
    store_bytes: int = 0  # bytes the store holds now (and queued for it)
    loads_skipped: int = 0  # requests whose blocks the cost model chose to recompute rather than load
    prefetched_reads: int = 0  # background reads started when the request arrived (not when admitted)
    load_waits: int = 0  # steps a load waited for a free block to write its next chunk into (a full pool)
    reread_loads: int = 0  # loads asked again from a shorter local hit (blocks before them evicted meanwhile)

    def reject(self, count: int, why: str) -> None:
        """Count `count` refused blobs (deleted by the caller); logged when the total reaches 1, 2, 4, 8, ... (a
        directory of damaged files is seen in the log, in a bounded number of lines)."""
        before, self.rejected_blocks = self.rejected_blocks, self.rejected_blocks + count
        if count and before.bit_length() < self.rejected_blocks.bit_length():
            _LOG.warning("hf_paged: %d KV block(s) refused from the store so far (%s); deleted, their tokens are "
                         "recomputed", self.rejected_blocks, why)
