"""Blocks computed under `head_merge` are only loaded by an engine with the same merge table: a merged layer stores
the representatives' key heads only, and its attention changes what every later layer computes. An engine without
the merge, or with another one, recomputes; one with the same merge loads them and answers as it does alone (fp32,
the same logits)."""

from __future__ import annotations

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import InProcessStore
from tests.kv_transfer.test_engine_transfer import BS, transfer_stats
from tests.tiny_models import ragged_prompts

# tiny llama: 4 query heads over 2 KV heads
KEEP_HEAD_0 = ((0, 0, 0, 0), (0, 1, 0, 1))  # both layers keep KV head 0's keys only
KEEP_HEAD_1 = ((2, 2, 2, 2), (2, 3, 2, 3))  # both layers keep KV head 1's keys only (the same key shapes)


def answer(engine, prompt):
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=4, output_logits=True))
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    out = engine.pop_output(rid)
    assert out.error is None
    return out.generated_tokens, torch.stack([torch.as_tensor(x) for x in out.logits])


@pytest.fixture(scope="module")
def prompt():
    return ragged_prompts([45], seed=21)[0]  # 5 full blocks of 8, then a partial one


@pytest.mark.parametrize(("saved_under", "loaded_under"), [
    (KEEP_HEAD_0, None), (None, KEEP_HEAD_0), (KEEP_HEAD_0, KEEP_HEAD_1)])
def test_blocks_of_another_merge_are_never_loaded(model, prompt, saved_under, loaded_under):
    store = InProcessStore()
    answer(Engine(model, PagedConfig(block_size=BS, head_merge=saved_under), kv_store=store), prompt)
    assert len(store._blobs) == 6
    engine = Engine(model, PagedConfig(block_size=BS, head_merge=loaded_under), kv_store=store)
    tokens, logits = answer(engine, prompt)
    stats = transfer_stats(engine)
    assert stats["loaded_blocks"] == 0 and stats["load_failures"] == 0  # keyed apart: never even asked
    alone_tokens, alone_logits = answer(Engine(model, PagedConfig(block_size=BS, head_merge=loaded_under)), prompt)
    assert tokens == alone_tokens and torch.equal(logits, alone_logits)


def test_the_same_merge_loads_and_answers_as_alone(model, prompt):
    store = InProcessStore()
    answer(Engine(model, PagedConfig(block_size=BS, head_merge=KEEP_HEAD_1), kv_store=store), prompt)
    engine = Engine(model, PagedConfig(block_size=BS, head_merge=KEEP_HEAD_1), kv_store=store)
    tokens, logits = answer(engine, prompt)
    assert transfer_stats(engine)["loaded_blocks"] == 5
    alone_tokens, alone_logits = answer(Engine(model, PagedConfig(block_size=BS, head_merge=KEEP_HEAD_1)), prompt)
    # (the same tokens; logits to the last bits only on one attention path: the CPU kernels load beside the first
    # engines, so an earlier engine may attend with SDPA and a later one with the kernel, or a chunk of 5 rows with
    # another SDPA path than one of 45: fp32 sums in another order. Another merge moves them by ~1e-3, measured)
    assert tokens == alone_tokens and torch.allclose(logits, alone_logits, rtol=1e-5, atol=1e-5), \
        (logits - alone_logits).abs().max()
