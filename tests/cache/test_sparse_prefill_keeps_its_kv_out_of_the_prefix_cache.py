"""Sparse prefill's K/V never reach the prefix cache: a chunk attended block-sparsely writes K/V no plain prefill
writes (and every later block of its request depends on them), so a later prompt sharing its tokens, one the config
says is dense (its context below `sparse_prefill_min_tokens`), would reuse another request's approximation (the h7
pass: an 860-token prompt's tokens changed after a 1,500-token one that shared its first 800)."""

from __future__ import annotations

import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.radix import RadixCache
from tests.tiny_models import ragged_prompts, tiny_model


def _run(engine: Engine, prompt: list[int]):
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=12, logprobs=0))
    while engine.has_unfinished:
        engine.step()
        engine.kv.check_integrity()
    out = engine.pop_output(rid)
    assert out.error is None, out.error
    return out.generated_tokens, torch.tensor([x.logprob for x in out.logprobs]), out.num_cached_tokens


def test_a_dense_prompt_after_a_sparse_one_sharing_its_start_equals_a_dense_engine():
    model = tiny_model("llama")
    long_doc = ragged_prompts([480], seed=4)[0]
    short = long_doc[:400] + ragged_prompts([40], seed=74)[0]  # 440 tokens < min_tokens: dense by the config
    common = dict(num_blocks=128, block_size=16, max_num_batched_tokens=256)
    ref_tokens, ref_logprobs, _ = _run(Engine(model, PagedConfig(**common)), short)
    sparse = PagedConfig(**common, sparse_prefill="vertical_slash", sparse_prefill_min_tokens=450,
                         sparse_keep_ratio=0.1)
    engine = Engine(model, sparse)
    _run(engine, long_doc)  # chunk 1: 256 tokens, context < 450, dense; chunk 2: context 480, sparse
    tokens, logprobs, num_cached = _run(engine, short)
    assert num_cached == 256, "only the blocks the dense first chunk wrote may be shared"
    assert tokens == ref_tokens
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=0, atol=1e-5)


def test_end_prefix_caps_what_the_prefix_cache_takes_and_survives_a_swap():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=4)
    kv = KVCacheManager(pool, 4, cache)
    tokens = list(range(1, 15))  # three full blocks and a tail of 2
    kv.add_sequence("s", tokens)
    assert kv.allocate_slots("s", 14)
    kv.end_prefix("s", 6)  # a sparse chunk began inside block 1: blocks 1 and later are not a plain prefill's
    assert kv.prefix_blocks("s") == 1
    kv.cache_full_blocks("s", tokens)
    assert cache.num_cached_blocks == 1
    assert not kv.cache_tail("s", tokens), "the tail of a sparse chunk is no plain prefill's either"
    kv.free("s")
    kv.add_sequence("t")  # a swap-in: fresh blocks, the cap restored with the dropped tokens
    assert kv.allocate_slots("t", 14)
    kv.restore_dropped("t", 0, None, num_prefix_blocks=1)
    kv.cache_full_blocks("t", tokens)
    assert cache.num_cached_blocks == 1
    kv.check_integrity()
