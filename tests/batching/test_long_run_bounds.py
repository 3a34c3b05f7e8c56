"""An engine that lives for days: what it keeps per draft model stays bounded, and unwrapping frees the model."""

from __future__ import annotations

import gc
import weakref

import torch

import hf_paged
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.speculative.speculator import MAX_DRAFT_MODELS
from hf_paged.processors import JSONSchemaLogitsProcessor
from tests.tiny_models import stock_greedy, tiny_model


def test_a_new_draft_model_per_request_keeps_at_most_max_draft_models():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=32))
    prompt = [5, 6, 7, 8, 5, 6, 7]
    expected = stock_greedy(model, [prompt], 6)[0]
    drafts = []
    for seed in range(MAX_DRAFT_MODELS + 3):
        drafts.append(weakref.ref(draft := tiny_model("llama", seed=seed + 10)))
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=6, num_speculative_tokens=2, draft_model=draft))
        out = engine.run([rid])[rid]
        assert out.generated_tokens == expected  # greedy: the draft never changes the tokens
        del draft
        assert len(engine.speculator.draft_models) <= MAX_DRAFT_MODELS
        engine.check_integrity()
    gc.collect()
    assert sum(ref() is not None for ref in drafts) == MAX_DRAFT_MODELS  # the older ones were let go
    assert drafts[-1]() is not None and drafts[0]() is None


def test_more_draft_models_at_once_than_the_cap_stay_exact():
    """Requests of more draft models than the cap in one batch: idle proposers come and go, the tokens do not."""
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
    prompt = [5, 6, 7, 8, 5, 6, 7]
    expected = stock_greedy(model, [prompt], 12)[0]
    drafts = [tiny_model("llama", seed=seed + 20) for seed in range(MAX_DRAFT_MODELS + 2)]
    ids = [engine.add_request(prompt, SamplingParams(max_new_tokens=12, num_speculative_tokens=2, draft_model=d))
           for d in drafts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == [expected] * len(ids)
    engine.check_integrity()
    assert all(not p.kv.seqs for p in engine.speculator.draft_models.values())


def test_unwrap_and_del_frees_the_model_after_generate_with_a_constraint():
    from tests.processors.toy_tokenizers import byte_level_tokenizer

    tok = byte_level_tokenizer()
    model = tiny_model("llama")
    model.resize_token_embeddings(len(tok))
    hf_paged.wrap(model, block_size=4, num_blocks=32)
    proc = JSONSchemaLogitsProcessor({"type": "object", "properties": {"a": {"type": "integer"}}}, tok)
    model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, logits_processor=[proc])
    model.generate_batch([[5, 6, 7]], sampling_params=SamplingParams(max_new_tokens=3))
    hf_paged.unwrap(model)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None, [type(r).__name__ for r in gc.get_referrers(ref())]
