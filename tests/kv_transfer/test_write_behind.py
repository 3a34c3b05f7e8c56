"""Saves to the disk tier leave the step thread: a bounded queue and a writer thread (`write_behind.py`); queued blocks
are read from the queue; shutdown flushes or discards and leaves no thread; a waiting request is hashed once."""

from __future__ import annotations

import threading
import time

from hf_paged import SamplingParams
from hf_paged.cache.digests import prefix_digests
from hf_paged.kv_transfer import DirectoryStore, InProcessStore, WriteBehindStore
from hf_paged.kv_transfer.request_digests import RequestDigests
from tests.forked import holds_in_forked_child
from tests.kv_transfer.test_engine_transfer import BS, disk_engine, evict_all, run, transfer_stats
from tests.tiny_models import ragged_prompts


def kv_threads(wait: float = 5.0) -> list[threading.Thread]:
    """Writer threads still alive in the process; one of an engine a test did not close ends within 1 s idle. (The
    reader threads of engines other tests left open stay until those are collected: `has_threads` checks one
    connector's both.)"""
    deadline = time.monotonic() + wait
    while True:
        alive = [t for t in threading.enumerate() if t.name.startswith("hf_paged-kv-write")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


class GatedStore(InProcessStore):
    """Writes wait for `gate`; records the threads that wrote."""

    name, background_reads = "gated", True

    def __init__(self):
        super().__init__()
        self.gate, self.writers = threading.Event(), set()

    def put(self, key, data):
        self.writers.add(threading.current_thread().name)
        assert self.gate.wait(10)
        return super().put(key, data)


def test_writes_are_queued_read_from_the_queue_bounded_and_flushed():
    inner = GatedStore()
    store = WriteBehindStore(inner, max_queue_bytes=250)
    assert store.put(b"a", bytes(100)) and store.put(b"b", b"x" * 100)
    assert store.contains(b"b") and store.get(b"b") == b"x" * 100  # not written yet: served from the queue
    assert not store.put(b"c", bytes(100))  # 300 > 250 queued bytes: dropped, counted
    assert store.counters.dropped_blocks == 1 and not store.contains(b"c")
    assert store.put(b"a", bytes(100))  # already queued: nothing new
    assert store.nbytes == 200 and inner.nbytes == 0
    inner.gate.set()
    assert store.flush(10)
    assert inner.get(b"a") == bytes(100) and inner.get(b"b") == b"x" * 100
    assert store.counters.written_blocks == 2 and store.queued_bytes == 0
    assert inner.writers == {"hf_paged-kv-write"}
    store.close()
    assert not store.is_writing and not kv_threads()


def test_delete_of_a_queued_block_and_close_without_flush():
    inner = GatedStore()
    store = WriteBehindStore(inner)
    for key in (b"1", b"2", b"3"):
        store.put(key, key * 10)
    deadline = time.monotonic() + 5
    while not inner.writers and time.monotonic() < deadline:  # the writer holds b"1" at the gate
        time.sleep(0.001)
    store.delete(b"1")  # being written: deleted once written
    store.delete(b"2")  # queued: dropped now
    assert store.get(b"2") is None and not store.contains(b"2")
    inner.gate.set()
    store.close(flush=False)  # b"3" may be discarded; nothing is half-written and no thread is left
    assert not inner.contains(b"1") and not inner.contains(b"2")
    assert store.queued_blocks == 0 and not kv_threads()


def wait_for_writer(inner: GatedStore) -> None:
    """Until the writer thread holds its first block at the gate (being written)."""
    deadline = time.monotonic() + 5
    while not inner.writers and time.monotonic() < deadline:
        time.sleep(0.001)
    assert inner.writers, "the writer thread never started"


def test_a_block_deleted_while_it_is_written_is_never_served():
    """A delete (a reader refused the blob) of a block the writer holds marks it: it is deleted once written. A read
    meanwhile must miss, not hand out the refused blob again from the queue."""
    inner = GatedStore()
    store = WriteBehindStore(inner)
    store.put(b"1", b"1" * 10)
    wait_for_writer(inner)
    store.delete(b"1")
    served = store.get(b"1")
    inner.gate.set()  # (before asserting: a failure leaves no writer waiting at the gate for the next tests)
    assert served is None
    assert store.flush(10)
    assert store.get(b"1") is None and not inner.contains(b"1")
    store.close()
    assert not kv_threads()


def test_a_block_saved_again_while_its_deleted_copy_is_written_is_written_once_and_counted_right():
    """Deleted while written, then saved again (the block was evicted again): the store says it lacks the block
    until the new save is queued, the old blob is deleted once written, the new one is written after it, and the
    queue's bytes come back to zero (the new save replaced the old entry: the writer dequeued the new one unwritten
    and the old one's bytes stayed counted for good, so the queue filled up and every later save was dropped)."""
    inner = GatedStore()
    store = WriteBehindStore(inner, max_queue_bytes=50)
    store.put(b"k", b"o" * 30)
    wait_for_writer(inner)
    store.delete(b"k")
    held = store.contains(b"k")  # it will be deleted: admission must not count it
    queued = store.put(b"k", b"n" * 20)
    seen = store.contains(b"k"), store.get(b"k")
    inner.gate.set()  # (before asserting: a failure leaves no writer waiting at the gate for the next tests)
    assert not held and queued and seen == (True, b"n" * 20)
    assert store.flush(10)
    assert store.queued_bytes == 0 and inner.get(b"k") == b"n" * 20
    assert store.counters.written_blocks == 2 and store.put(b"j", b"j" * 50)  # the whole bound is free again
    store.close()
    assert not kv_threads()


def test_the_step_thread_never_writes_and_outputs_match(model, prompts, expected, tmp_path):
    engine = disk_engine(model, tmp_path)
    writer = engine.scheduler.kv_transfer.saver.writer
    assert isinstance(writer, WriteBehindStore) and isinstance(writer.inner, DirectoryStore)
    threads: set[str] = set()
    put = writer.inner.put

    def recording_put(key, data):
        threads.add(threading.current_thread().name)
        return put(key, data)

    writer.inner.put = recording_put
    assert run(engine, prompts[:1]) == expected[:1]
    evict_all(engine)
    assert engine.scheduler.kv_transfer.flush(10)
    assert threads == {"hf_paged-kv-write"}
    stats = transfer_stats(engine)
    assert stats["saved_blocks"] == len(list(tmp_path.glob("*.kvb"))) >= 5 and stats["save_dropped"] == 0
    assert run(engine, prompts) == expected
    assert transfer_stats(engine)["loaded_blocks"] >= 5
    engine.scheduler.kv_transfer.close()
    assert not engine.scheduler.kv_transfer.has_threads and not kv_threads()


def test_a_block_still_queued_is_loaded_from_the_queue(model, prompts, expected, tmp_path):
    gated = GatedStore()
    engine = disk_engine(model, tmp_path)
    connector = engine.scheduler.kv_transfer
    connector.saver.writer.inner = gated  # writes never reach the store until the gate opens
    connector.saver.store = gated
    run(engine, prompts[:1])
    run(engine, ragged_prompts([90, 90], seed=99), max_new=1)  # evicts the prompt's blocks into the queue
    assert gated.nbytes == 0 and connector.saver.writer.queued_blocks >= 5
    assert run(engine, prompts[:1]) == expected[:1]  # no read-before-write miss
    assert transfer_stats(engine)["loaded_blocks"] == 5
    gated.gate.set()
    connector.close()
    assert gated.nbytes > 0 and not connector.has_threads and not kv_threads()


def test_a_full_queue_drops_saves_and_changes_no_output(model, prompts, expected, tmp_path):
    engine = disk_engine(model, tmp_path)
    connector = engine.scheduler.kv_transfer
    connector.saver.writer.max_queue_bytes = 1  # every save finds the queue full
    assert run(engine, prompts[:1]) == expected[:1]
    evict_all(engine)
    assert run(engine, prompts) == expected
    stats = transfer_stats(engine)
    assert stats["save_dropped"] >= 5 and stats["saved_blocks"] == 0 and stats["loaded_blocks"] == 0
    engine.check_integrity()


def test_a_restart_in_the_same_process_sees_queued_writes(model, prompts, expected, tmp_path):
    engine = disk_engine(model, tmp_path)
    inner = engine.scheduler.kv_transfer.saver.writer.inner
    put = inner.put

    def slow_put(key, data):
        time.sleep(0.02)
        return put(key, data)

    inner.put = slow_put
    run(engine, prompts[:1])
    evict_all(engine)
    restarted = disk_engine(model, tmp_path)  # opening the directory flushes this process's queued writes first
    assert run(restarted, prompts[:1]) == expected[:1]
    assert transfer_stats(restarted)["loaded_blocks"] == 5
    for e in (engine, restarted):
        e.scheduler.kv_transfer.close()
        assert not e.scheduler.kv_transfer.has_threads
    assert not kv_threads()


def test_save_cached_flushes_and_close_leaves_no_thread(model, prompts, expected, tmp_path):
    engine = disk_engine(model, tmp_path, num_blocks=64)
    run(engine, prompts)
    assert engine.scheduler.kv_transfer.save_cached() == 8
    assert len(list(tmp_path.glob("*.kvb"))) == 8  # on disk when it returns
    engine.scheduler.kv_transfer.close()
    assert not engine.scheduler.kv_transfer.has_threads and not kv_threads()


def test_request_digests_match_prefix_digests_and_hash_each_block_once():
    tokens = ragged_prompts([37], seed=3)[0]
    memo = RequestDigests(8)
    assert memo.digests("r", tokens[:20], ("salt",)) == prefix_digests(tokens[:20], 8, ("salt",))
    assert memo.hashed_blocks == 2
    assert memo.digests("r", tokens, ("salt",)) == prefix_digests(tokens, 8, ("salt",))
    assert memo.hashed_blocks == 4  # the first two reused
    assert memo.digests("r", tokens[:16], ("salt",)) == prefix_digests(tokens[:16], 8, ("salt",))
    assert memo.hashed_blocks == 4
    other = ragged_prompts([37], seed=4)[0]
    assert memo.digests("r", other) == prefix_digests(other, 8)  # other tokens under the same id: hashed anew
    memo.forget("r")
    assert len(memo) == 0


def test_a_long_queue_hashes_each_waiting_prompt_once(model, tmp_path):
    """Admission asks the store about waiting prompts at every step; their digests are computed once (blocks a
    preempted request's outputs added are hashed as they come)."""
    prompts = ragged_prompts([40] * 6, seed=8)
    engine = disk_engine(model, tmp_path, num_blocks=12, max_num_seqs=2)
    connector = engine.scheduler.kv_transfer
    asked, load_step = [], connector.load_step

    def counting(seq_id, token_ids, extra_keys=(), token_budget=None):
        asked.append((len(token_ids) - 1) // BS)  # the blocks one ask would hash without the memo
        return load_step(seq_id, token_ids, extra_keys, token_budget)

    connector.load_step = counting
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=12)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
    assert all(engine.pop_output(i).error is None for i in ids)
    memo = connector.digests
    assert len(asked) > 2 * len(prompts) and memo.hashed_blocks < sum(asked) / 2
    assert memo.hashed_blocks <= len(prompts) * ((40 + 12) // BS)  # each block of each request once at most
    assert len(memo) == 0  # every entry dropped when its request ended


def test_a_process_forked_while_the_writer_ran_writes_its_own_saves():
    """The writer thread stays in the parent: a child forked meanwhile queued its saves until the queue was full, and
    its `flush` waited for ever. It drops its copy of the parent's queue and starts a writer of its own."""
    inner = GatedStore()
    store = WriteBehindStore(inner)
    assert store.put(b"parent", b"p" * 64)
    deadline = time.monotonic() + 10
    while not inner.writers and time.monotonic() < deadline:  # the writer is inside the parent's put
        time.sleep(0.01)

    def child() -> bool:
        inner.gate.set()  # (the child's copy of the store writes at once)
        return store.put(b"child", b"c" * 64) and store.flush(timeout=10) and inner.get(b"child") == b"c" * 64

    assert holds_in_forked_child(child, after=inner.gate.set), "the forked child's save was not written"
    assert store.flush(timeout=10) and inner.get(b"parent") == b"p" * 64
    store.close()
