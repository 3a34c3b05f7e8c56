"""A process forked while a KV read ran (gunicorn --preload, a pool or DataLoader worker): the fetcher's worker
thread stays in the parent, so the read in flight, and every later one, never finished in the child (its requests
waited for ever). The child reads again on a worker of its own."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hf_paged.kv_transfer import BlockLayout, InProcessStore
from hf_paged.kv_transfer.fetcher import BlockAsk, BlockFetcher
from tests.forked import holds_in_forked_child

LAYOUT = BlockLayout("ab" * 16, 8, 2, 2, 8, "float32", "plain", "full")
ASKS = [BlockAsk(b"missing", bytes(16), list(range(8)))]  # (a miss: the read ends with no block)


class GatedStore(InProcessStore):
    """Reads wait for `gate` (the parent's read is in flight when the process forks)."""

    def __init__(self):
        super().__init__()
        self.gate, self.reading = threading.Event(), threading.Event()

    def get(self, key):
        self.reading.set()
        assert self.gate.wait(20)
        return super().get(key)


def _taken(fetcher: BlockFetcher, seq_id, wait_s: float = 10.0):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        fetch = fetcher.take(seq_id)
        if fetch is not None:
            return fetch
        time.sleep(0.01)
    return None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_mid_read_reads_again_and_reads_new_blocks():
    store = GatedStore()
    fetcher = BlockFetcher(store)
    fetcher.submit("parent", LAYOUT, ASKS, first=0, epoch=0)
    assert store.reading.wait(10)

    def child() -> bool:
        store.gate.set()  # (the child's copy of the store answers at once)
        fetcher.submit("child", LAYOUT, ASKS, first=0, epoch=0)
        old, new = _taken(fetcher, "parent"), _taken(fetcher, "child")
        return old is not None and new is not None and old.future.result().blocks == []

    assert holds_in_forked_child(child, after=store.gate.set), "the forked child's reads did not finish"
    assert _taken(fetcher, "parent") is not None
    fetcher.close()
