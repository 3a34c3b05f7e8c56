"""Colocated replicas sharing hot prefixes (`--kv-share`) on a real local Ray cluster: a replica in its own process
publishes the blocks of its prefix hits, another loads them and answers as stock generate does; a corrupt block or
one of another model is refused, counted and recomputed; the directory's lease bounds what is published, and a block
that fell out is recomputed."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

BS = 8
MAX_NEW = 8


@pytest.fixture(scope="module")
def cluster():
    from tests.ray_cluster import local_ray

    with local_ray():
        yield


@pytest.fixture(scope="module")
def prompts():
    from tests.tiny_models import ragged_prompts

    system = ragged_prompts([45], seed=41)[0]  # 5 full blocks of 8 shared, then a partial one
    return [system + q for q in ragged_prompts([3, 11], seed=42)]


@pytest.fixture(scope="module")
def expected(prompts):
    from tests.tiny_models import stock_greedy, tiny_model

    return stock_greedy(tiny_model("llama"), prompts, MAX_NEW)


def sharing_engine(directory: str, seed: int = 0, **bounds):
    import torch

    from hf_paged import Engine, PagedConfig
    from hf_paged.scaleout.kv_share import attach_kv_share
    from tests.tiny_models import tiny_model

    torch.set_num_threads(1)
    engine = Engine(tiny_model("llama", seed=seed), PagedConfig(block_size=BS))
    return engine, attach_kv_share(engine, directory, **bounds)


class Replica:
    """A sharing engine in its own process (replica A)."""

    def __init__(self, directory: str, **bounds) -> None:
        self.engine, self.store = sharing_engine(directory, **bounds)

    def run(self, prompts: list[list[int]]) -> list[list[int]]:
        from tests.tiny_models import run_engine

        out = run_engine(self.engine, prompts, MAX_NEW, pool_empty=True)
        self.store.flush()  # (the publish registered without waiting: make it visible before the test goes on)
        return out

    def stats(self) -> dict:
        return transfer_stats(self.engine)


def transfer_stats(engine) -> dict:
    return {k.removeprefix("kv_transfer_"): v for k, v in engine.stats().items() if k.startswith("kv_transfer_")}


def test_a_replica_loads_what_a_peer_reused_and_answers_identically(cluster, prompts, expected):
    from tests.tiny_models import run_engine

    a = ray.remote(Replica).options(num_cpus=0).remote("share-identical")
    assert ray.get(a.run.remote(prompts[:1])) == expected[:1]
    assert ray.get(a.stats.remote())["saved_blocks"] == 0  # computed once, never hit: not hot, not published
    assert ray.get(a.run.remote(prompts[1:])) == expected[1:]
    assert ray.get(a.stats.remote())["saved_blocks"] == 5  # the second prompt hit the 5 shared blocks
    b, store = sharing_engine("share-identical")
    assert run_engine(b, prompts[1:], MAX_NEW, pool_empty=True) == expected[1:]
    stats = transfer_stats(b)
    assert stats["loaded_blocks"] == 5 and stats["loaded_tokens"] == 5 * BS and stats["load_failures"] == 0
    assert b.kv.prefix_cache.num_hit_tokens == 0  # nothing was a local hit: the 40 tokens came from A
    assert run_engine(b, prompts[:1], MAX_NEW, pool_empty=True) == expected[:1]  # a local hit on the loaded blocks
    assert transfer_stats(b)["saved_blocks"] == 0  # ... which the directory knows: published once, cluster-wide
    store.flush()
    assert store.directory_stats()["collected_blocks"] >= 5
    ray.kill(a)


@pytest.mark.parametrize("fault", ["corrupt", "other-model"])
def test_a_corrupt_or_foreign_block_is_refused_counted_and_recomputed(cluster, prompts, expected, fault):
    from tests.tiny_models import run_engine

    directory = f"share-{fault}"
    b, store = sharing_engine(directory)
    connector = b.scheduler.kv_transfer
    digests = b.kv.prefix_cache.digests(prompts[0][: 5 * BS])
    ours = connector._keys(digests)
    if fault == "corrupt":  # our own block, one byte flipped in its tensors (the checksum catches it)
        donor, donor_store = sharing_engine(directory + "-donor")
        run_engine(donor, prompts, MAX_NEW)
        donor_store.flush()
        blob = bytearray(donor_store.get(ours[0]))
        blob[-100] ^= 0xFF
    else:  # another model's block (other weights) under this model's key
        other, other_store = sharing_engine(directory + "-other", seed=1)
        run_engine(other, prompts, MAX_NEW)
        other_store.flush()
        blob = bytearray(other_store.get(other.scheduler.kv_transfer._keys(digests)[0]))
    store.put(ours[0], bytes(blob))
    store.flush()
    assert run_engine(b, prompts[:1], MAX_NEW, pool_empty=True) == expected[:1]  # refused, never loaded
    stats = transfer_stats(b)
    assert stats["loaded_blocks"] == 0 and stats["rejected_blocks"] == 1 and stats["load_failures"] == 1
    store.flush()
    assert store.directory_stats()["dropped_blocks"] == 1  # the bad blob left the directory


def test_the_lease_bounds_what_is_published_and_an_expired_block_is_recomputed(cluster, prompts, expected):
    from tests.tiny_models import run_engine

    a = ray.remote(Replica).options(num_cpus=0).remote("share-lease", max_blocks=2)  # creates the directory
    ray.get(a.__ray_ready__.remote())
    b, store = sharing_engine("share-lease")
    assert ray.get(a.run.remote(prompts)) == expected  # 5 hot blocks published into a directory of 2
    stats = store.directory_stats()
    assert stats["num_blocks"] <= 2 and stats["evicted_blocks"] >= 3 and stats["evicted_uncollected"] >= 3
    assert run_engine(b, prompts[1:], MAX_NEW, pool_empty=True) == expected[1:]
    loaded = transfer_stats(b)
    # blocks 0..2 fell out of the lease: the chain breaks at block 0, so all 5 are recomputed, and nothing failed
    assert loaded["loaded_blocks"] == 0 and loaded["load_failures"] == 0
    ray.kill(a)



def test_a_lookup_asks_the_directory_only_for_blocks_worth_a_round_trip(cluster, prompts, expected):
    from hf_paged.kv_transfer import TransferCostModel
    from hf_paged.kv_transfer.hot_blocks import ASK_FACTOR, EXPLORE_EVERY
    from tests.tiny_models import ragged_prompts, run_engine

    b, _ = sharing_engine("share-ask")
    connector = b.scheduler.kv_transfer
    connector.cost = TransferCostModel(prefill_prior=8000.0, learn=False)  # 8 tokens: 1 ms, under 4 round trips
    peers = connector.hot.store
    assert ASK_FACTOR * 1e-3 * 8000.0 == 32  # (the prior round trip: 1 ms) -> more than 32 tokens are worth asking
    run_engine(b, ragged_prompts([12], seed=43), MAX_NEW)  # one block past its (empty) hit: no round trip
    assert peers.num_syncs == 0
    assert run_engine(b, prompts[:1], MAX_NEW) == expected[:1]  # five blocks (40 tokens): one round trip
    assert peers.num_syncs == 1
    publisher = connector.hot
    asked = [publisher.worth_asking(8, connector.cost) for _ in range(EXPLORE_EVERY)]
    assert asked.count(True) == 1  # one lookup in EXPLORE_EVERY kept from asking measures the round trip again


def test_engine_replicas_built_with_kv_share_share_and_count_it_in_metrics(cluster):
    """The deployment's own replica class (`deploy(kv_share=True)` builds it; here outside Serve): B answers A's
    hot prompt as A does, from A's blocks, and its /metrics count them."""
    import asyncio
    import json
    import re

    from hf_paged.scaleout.asgi import HttpCall, ResponseStart
    from hf_paged.scaleout.deploy import EngineReplica
    from hf_paged.scaleout.spec import ReplicaSpec

    spec = ReplicaSpec(kv_share=True, kv_directory="share-replicas", paged={"block_size": 16}, torch_threads=1)
    body = json.dumps({"model": spec.name, "prompt": "The paged cache keeps every block. " * 6, "max_tokens": 4,
                       "temperature": 0}).encode()

    async def complete(replica) -> str:
        items = [item async for item in replica.forward(
            HttpCall("POST", "/v1/completions", headers=((b"content-type", b"application/json"),), body=body))]
        assert isinstance(items[0], ResponseStart) and items[0].status == 200, items
        return json.loads(b"".join(items[1:]))["choices"][0]["text"]

    async def scenario():
        a, b = EngineReplica(spec), EngineReplica(spec)
        try:
            first, second = await complete(a), await complete(a)  # the second is a hit: A publishes the blocks
            a.kv_store.flush()
            assert await complete(b) == first == second
            text = (await b.metrics()).text
            tokens = re.search(r'^hf_paged:kv_transfer_loaded_tokens_total\{[^}]*\} (\S+)$', text, re.MULTILINE)
            blocks = re.search(r'^hf_paged:kv_transfer_loaded_blocks_total\{[^}]*\} (\S+)$', text, re.MULTILINE)
            assert tokens and blocks and float(tokens.group(1)) == 16 * float(blocks.group(1)) > 0, text[-800:]
        finally:
            for replica in (a, b):
                replica.engine.loop.shutdown()

    asyncio.run(scenario())


def test_a_directory_that_does_not_answer_is_a_miss_and_the_prompt_is_computed(cluster, prompts, expected):
    from tests.tiny_models import run_engine

    b, store = sharing_engine("share-dead-directory")
    ray.kill(store.directory)  # every lookup's sync now raises
    assert run_engine(b, prompts[:1], MAX_NEW, pool_empty=True) == expected[:1]
    peers = b.scheduler.kv_transfer.hot.store
    assert peers.num_sync_failures >= 1 and transfer_stats(b)["loaded_blocks"] == 0


def test_the_block_holding_a_prompts_last_token_is_never_published(cluster):
    from tests.tiny_models import ragged_prompts, run_engine

    a, store = sharing_engine("share-last-token")
    prompt = ragged_prompts([4 * BS], seed=44)[0]  # 4 full blocks: the 4th holds the last token
    run_engine(a, [prompt, prompt], MAX_NEW, pool_empty=True)  # the second is a hit on blocks 0..2 (never the 4th)
    assert transfer_stats(a)["saved_blocks"] == 3
    keys = a.scheduler.kv_transfer._keys(a.kv.prefix_cache.digests(prompt))
    store.flush()
    assert [store.knows(k) for k in keys] == [True, True, True, False]
