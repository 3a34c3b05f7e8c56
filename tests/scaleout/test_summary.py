"""What a replica reports: cached_digests' order and prefix closure, the wire format, the engine reporter."""

from __future__ import annotations

import pytest

from hf_paged.batching.engine import Engine
from hf_paged.batching.sampling import SamplingParams
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.radix import RadixCache, prefix_digests
from hf_paged.config import PagedConfig
from hf_paged.scaleout import CacheSummary, build_summary, fingerprint, prompt_fingerprints
from hf_paged.scaleout.replica import ReplicaReporter, engine_load_tokens
from tests.tiny_models import tiny_model


def run(pool: BlockPool, cache: RadixCache, tokens: list[int]) -> None:
    """A request to completion: reuse the cached prefix, allocate the rest, insert, free."""
    hit = cache.match(tokens)
    pool.incref(hit.block_ids)
    table = hit.block_ids + pool.allocate(-(-len(tokens) // cache.block_size) - len(hit.block_ids))
    cache.insert(tokens, table)
    pool.free(reversed(table))


def test_cached_digests_most_recent_first_parents_before_children():
    pool = BlockPool(16)
    cache = RadixCache(pool, block_size=2)
    run(pool, cache, [1, 2, 3, 4, 5, 6])  # blocks A=[1,2] B=[3,4] C=[5,6]
    run(pool, cache, [7, 8, 9, 10])  # D E (more recent)
    a, b, c = prefix_digests([1, 2, 3, 4, 5, 6], 2)
    d, e = prefix_digests([7, 8, 9, 10], 2)
    assert cache.cached_digests() == [d, e, a, b, c]
    cache.match([1, 2, 3, 4])  # touches A and B: now the most recent, C stays behind
    assert cache.cached_digests() == [a, b, d, e, c]
    assert cache.cached_digests(3) == [a, b, d]
    assert cache.cached_digests(0) == []
    cache.check_integrity()


def test_a_capped_summary_is_closed_under_prefixes():
    pool = BlockPool(64)
    cache = RadixCache(pool, block_size=2)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [1, 2, 11, 12, 13, 14], [20, 21, 22, 23]]
    for i in range(12):
        run(pool, cache, prompts[(i * 5) % len(prompts)])
    for limit in range(cache.num_cached_blocks + 1):
        held = set(cache.cached_digests(limit))
        for prompt in prompts:
            chain = prefix_digests(prompt, 2)
            for i, digest in enumerate(chain):
                if digest in held:
                    assert set(chain[:i]) <= held, f"limit {limit}: a block is reported without its prefix"


def test_build_summary_round_trips_through_routing_stats():
    pool = BlockPool(16)
    cache = RadixCache(pool, block_size=2)
    run(pool, cache, [1, 2, 3, 4, 5])
    summary = build_summary(cache, limit=8, load_tokens=42, seq=7, now=100.0)
    assert summary.keys() == frozenset(prompt_fingerprints([1, 2, 3, 4], 2))
    assert (summary.num_fingerprints, summary.num_cached_blocks, summary.is_truncated) == (2, 2, False)
    assert summary.nbytes == 2 * 8 + 48
    assert summary.age(now=101.5) == 1.5
    stats = summary.to_stats()
    assert all(isinstance(v, (int, float, bytes)) for v in stats.values())
    assert CacheSummary.from_stats(stats) == summary
    assert CacheSummary.from_stats({}) is None
    capped = build_summary(cache, limit=1)
    assert capped.is_truncated and capped.keys() == {fingerprint(prefix_digests([1, 2], 2)[0])}


def test_summary_errors_name_the_fix():
    with pytest.raises(ValueError, match="same hf_paged version"):
        CacheSummary.from_stats({"format": 99})
    with pytest.raises(ValueError, match="8 bytes per block"):
        CacheSummary.from_stats({"format": 1, "block_size": 2, "fingerprints": b"123", "num_cached_blocks": 0,
                                 "load_tokens": 0, "seq": 0, "created_at": 0.0})
    with pytest.raises(ValueError, match="limit"):
        build_summary(RadixCache(BlockPool(4), block_size=2), limit=-1)


def test_engine_reporter_reports_what_the_engine_cached_and_its_load():
    engine = Engine(tiny_model(), PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64))
    reporter = ReplicaReporter(engine, limit=100)
    prompt = list(range(3, 21))  # 18 tokens: 4 full blocks
    assert reporter.summary().num_fingerprints == 0 and reporter.summary().seq == 2
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=3))
    assert engine_load_tokens(engine) == 18 + 3  # queued: the whole prompt and the output budget
    engine.run([rid])
    assert engine_load_tokens(engine) == 0
    summary = reporter.summary()
    assert set(prompt_fingerprints(prompt, 4, reporter.extra_keys)) <= summary.keys()
    assert summary.load_tokens == 0 and summary.block_size == 4
    assert ReplicaReporter(engine).limit == engine.cache.num_blocks  # by default a summary is never cut


def test_reporter_needs_a_prefix_cache():
    engine = Engine(tiny_model(), PagedConfig(block_size=4, num_blocks=16, enable_prefix_caching=False))
    with pytest.raises(ValueError, match="enable_prefix_caching=True"):
        ReplicaReporter(engine)


def test_fingerprints_are_a_fixed_function_of_the_tokens():
    # A golden value: the router and the replicas run in different processes (and versions must agree).
    assert prompt_fingerprints([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [7094924299296944029, 18034527790882267923]
