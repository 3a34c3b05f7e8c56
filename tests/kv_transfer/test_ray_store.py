"""KV blocks through Ray's object store: the directory's leases (plain Python), then two engines in two processes on
a real local Ray cluster (an actor computes and puts, the driver loads): tokens equal to recomputing, foreign blocks
refused and counted, an owner that died recomputed."""

from __future__ import annotations

import time

import pytest

from hf_paged.kv_transfer.ray_store import KVBlockDirectory

ray = pytest.importorskip("ray")

MAX_NEW = 8
BS = 8


# -- the directory alone ---------------------------------------------------------------------------------------
def test_directory_leases_count_blocks_and_bytes_and_renew_on_collection():
    d = KVBlockDirectory(max_blocks=4, max_bytes=1000)
    d.register([(bytes([i]), ["ref"], 100) for i in range(4)])
    d.register([], collected=[bytes([0])])  # block 0 read: its lease renewed
    d.register([(bytes([4]), ["ref"], 100), (bytes([5]), ["ref"], 100)])
    cursor, reset, adds, drops = d.changes_since(0)
    assert not reset and {k for k, _, _ in adds} == {bytes([i]) for i in (0, 3, 4, 5)}
    assert drops == [bytes([1]), bytes([2])]
    stats = d.get_stats()
    assert stats == {**stats, "num_blocks": 4, "nbytes": 400, "evicted_blocks": 2, "evicted_uncollected": 2,
                     "registered_blocks": 6, "collected_blocks": 1}
    d.register([(b"big", ["ref"], 700)])  # bytes bound: the oldest goes (3: block 0 was renewed after it)
    assert d.changes_since(cursor)[2:] == ([(b"big", ["ref"], 700)], [bytes([3])])
    assert d.get_stats()["nbytes"] == 1000 and d.get_stats()["evicted_uncollected"] == 3
    d.register([(b"huge", ["ref"], 1001)])  # never fits: not registered, nothing evicted for it
    assert d.get_stats()["num_blocks"] == 4
    d.register([], dropped=[b"big"])
    assert d.get_stats()["dropped_blocks"] == 1 and d.changes_since(cursor + 1)[3][-1] == b"big"


def test_directory_resends_the_whole_table_to_a_mirror_it_cannot_serve():
    d = KVBlockDirectory(max_blocks=8)
    d.register([(b"a", ["r"], 1), (b"b", ["r"], 1)])
    assert d.changes_since(99)[1] is True  # a cursor from another (older) directory
    assert sorted(k for k, _, _ in d.changes_since(99)[2]) == [b"a", b"b"]
    with pytest.raises(ValueError, match="max_blocks"):
        KVBlockDirectory(max_blocks=0)


# -- two engines on real Ray ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    from tests.ray_cluster import local_ray

    with local_ray():
        yield


@pytest.fixture(scope="module")
def prompts():
    from tests.tiny_models import ragged_prompts

    system = ragged_prompts([45], seed=31)[0]  # 5 full blocks of 8 shared, then a partial one
    return [system + q for q in ragged_prompts([3, 11], seed=32)]


class PrefillWorker:
    """An engine in its own process, writing every block its prefix cache takes into the object store."""

    def __init__(self, directory: str, seed: int = 0) -> None:
        import torch

        from hf_paged import Engine, PagedConfig
        from hf_paged.kv_transfer.ray_store import RayObjectStore
        from tests.tiny_models import tiny_model

        torch.set_num_threads(1)
        self.store = RayObjectStore(directory)
        self.engine = Engine(tiny_model("llama", seed=seed), PagedConfig(block_size=BS), kv_store=self.store)

    def run(self, prompts: list[list[int]]) -> list[list[int]]:
        from hf_paged import SamplingParams

        ids = [self.engine.add_request(p, SamplingParams(max_new_tokens=MAX_NEW)) for p in prompts]
        outs = self.engine.run(ids)
        self.store.flush()
        return [outs[i].generated_tokens for i in ids]

    def saved_blocks(self) -> int:
        return self.engine.stats()["kv_transfer_saved_blocks"]


def run(engine, prompts):
    from hf_paged import SamplingParams

    ids = [engine.add_request(p, SamplingParams(max_new_tokens=MAX_NEW)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs)
    assert engine.cache.pool.num_used_blocks == 0
    return [o.generated_tokens for o in outs]


def transfer_stats(engine) -> dict:
    return {k.removeprefix("kv_transfer_"): v for k, v in engine.stats().items() if k.startswith("kv_transfer_")}


def decode_engine(model, directory):
    from hf_paged import Engine, PagedConfig
    from hf_paged.kv_transfer.ray_store import RayObjectStore

    store = RayObjectStore(directory)
    return Engine(model, PagedConfig(block_size=BS), kv_store=store), store


def test_blocks_put_by_another_process_load_token_identical(cluster, prompts):
    from tests.tiny_models import stock_greedy, tiny_model

    model = tiny_model("llama")
    expected = stock_greedy(model, prompts, MAX_NEW)
    worker = ray.remote(PrefillWorker).options(num_cpus=0).remote("dir-identical")
    assert ray.get(worker.run.remote(prompts)) == expected
    assert ray.get(worker.saved_blocks.remote()) > 0
    engine, store = decode_engine(model, "dir-identical")
    assert run(engine, prompts) == expected
    stats = transfer_stats(engine)
    # the first prompt loads its 5 full blocks (the 6th holds its last token); the second hits them locally, then
    # loads one more of its own
    assert stats["loaded_blocks"] == 5 + 1 and stats["load_failures"] == 0 and stats["rejected_blocks"] == 0
    store.flush()
    assert store.directory_stats()["collected_blocks"] >= 6  # (a read may fetch blocks a local hit then covers)
    ray.kill(worker)


def test_a_block_of_another_model_is_refused_counted_and_recomputed(cluster, prompts):
    from hf_paged import Engine, PagedConfig
    from hf_paged.kv_transfer.block_format import decode_block
    from hf_paged.kv_transfer.ray_store import RayObjectStore
    from tests.tiny_models import stock_greedy, tiny_model

    model = tiny_model("llama")
    expected = stock_greedy(model, prompts[:1], MAX_NEW)
    other_store = RayObjectStore("dir-foreign")
    other = Engine(tiny_model("llama", seed=1), PagedConfig(block_size=BS), kv_store=other_store)  # other weights
    run(other, prompts[:1])
    other_store.flush()
    engine, store = decode_engine(model, "dir-foreign")
    digests = engine.kv.prefix_cache.digests(prompts[0][: 5 * BS])
    theirs, ours = other.scheduler.kv_transfer._keys(digests), engine.scheduler.kv_transfer._keys(digests)
    assert store.contains(theirs[0]) and not store.contains(ours[0])  # keys name the fingerprint: no match
    for src, dst in zip(theirs, ours):  # the other model's blobs put under this engine's keys
        store.put(dst, bytes(other_store.get(src)))
    store.flush()
    assert run(engine, prompts[:1]) == expected  # refused by their headers, never loaded
    stats = transfer_stats(engine)
    assert stats["loaded_blocks"] == 0 and stats["rejected_blocks"] == 1 and stats["load_failures"] == 1
    store.flush()
    assert store.directory_stats()["dropped_blocks"] == 1  # the refused blob left the directory
    # ... and the engine's own recomputed block took its key (written through as the prefix cache took it)
    layout = engine.scheduler.kv_transfer.layout()
    assert decode_block(store.get(ours[0]), layout, digests[0]).digest == digests[0]


def _fail() -> None:
    raise OSError("the node holding this block went away")


def test_a_block_that_cannot_be_read_is_dropped_and_recomputed(cluster, prompts):
    from tests.tiny_models import stock_greedy, tiny_model

    model = tiny_model("llama")
    expected = stock_greedy(model, prompts[:1], MAX_NEW)
    engine, store = decode_engine(model, "dir-lost")
    keys = engine.scheduler.kv_transfer._keys(engine.kv.prefix_cache.digests(prompts[0][: 5 * BS]))
    lost = ray.remote(_fail).options(num_cpus=0).remote()  # a ref whose read raises, as a lost object's does
    ray.get(store.directory.register.remote([(keys[0], [lost], 1000)]))
    assert run(engine, prompts[:1]) == expected
    stats = transfer_stats(engine)
    assert stats["loaded_blocks"] == 0 and stats["load_failures"] == 1 and store.num_lost == 1
    store.flush()
    assert store.directory_stats()["dropped_blocks"] == 1


@pytest.mark.slow  # test_a_block_that_cannot_be_read_is_dropped_and_recomputed covers the failed read in the
# default run. Here, reading an object whose owner was just killed aborted the whole pytest process (SIGABRT in Ray's
# driver core worker, ~20 ms after Ray failed the dead actor's pending call; 2 of ~5 runs of tests/kv_transfer at
# load 11-23, none alone): a crash in Ray's driver would take every later test of the run with it.
def test_blocks_whose_owner_died_are_loaded_or_recomputed_never_wrong(cluster, prompts):
    from tests.tiny_models import stock_greedy, tiny_model

    model = tiny_model("llama")
    expected = stock_greedy(model, prompts[:1], MAX_NEW)
    worker = ray.remote(PrefillWorker).options(num_cpus=0).remote("dir-dead")
    ray.get(worker.run.remote(prompts[:1]))
    engine, store = decode_engine(model, "dir-dead")
    assert store.contains(engine.scheduler.kv_transfer._keys(engine.kv.prefix_cache.digests(prompts[0][:BS]))[0])
    ray.kill(worker)  # the process that owns the objects is gone: a copy still in this node's memory may be read
    deadline = time.monotonic() + 30  # (the kill is asynchronous: a call right after it may still be served)
    while time.monotonic() < deadline:
        try:
            ray.get(worker.saved_blocks.remote())
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.1)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(worker.saved_blocks.remote())
    assert run(engine, prompts[:1]) == expected
    stats = transfer_stats(engine)
    assert stats["loaded_blocks"] == 5 or (stats["load_failures"] == 1 and store.num_lost >= 1), stats


def test_a_writer_keeps_no_refs_so_the_lease_alone_frees_blocks(cluster):
    from hf_paged.kv_transfer.ray_store import RayObjectStore

    writer = RayObjectStore("dir-writer", sync_on_miss=False, max_blocks=2, flush_blocks=1)
    blobs = {bytes([i]) * 8: bytes([i]) * 1000 for i in range(3)}
    for key, blob in blobs.items():
        assert writer.put(key, blob)
    writer.flush()
    first, _, last = blobs
    assert not writer.contains(first) and writer.contains(last)  # its keys: the latest max_blocks
    assert writer.get(last) is None  # and no ref to read them back with
    reader = RayObjectStore("dir-writer")
    assert bytes(reader.get(last) if reader.contains(last) else b"") == blobs[last]
    assert not reader.contains(first)  # the directory's lease (2 blocks) let it go
    stats = reader.directory_stats()
    assert stats["evicted_blocks"] == 1 and stats["evicted_uncollected"] == 1 and stats["num_blocks"] == 2
