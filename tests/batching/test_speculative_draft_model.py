"""Drafting with a second model (`SamplingParams.draft_model`): greedy parity whatever the draft's quality, its own
paged cache kept consistent (mirrors cut back to the verified tokens, released at the end)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from tests.batching.test_speculative_parity import prompts_with_shared_prefix, run_checked
from tests.tiny_models import stock_greedy, tiny_model

MAX_NEW = 24


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("draft_kind", ["itself", "another"])
def test_draft_model_parity_with_chunked_prefill_preemption_and_prefix_hits(family, draft_kind):
    model = tiny_model(family)
    draft = model if draft_kind == "itself" else tiny_model(family, seed=7)
    prompts = prompts_with_shared_prefix()
    expected = stock_greedy(model, prompts, MAX_NEW)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=16, max_num_batched_tokens=16))
    params = SamplingParams(max_new_tokens=MAX_NEW, num_speculative_tokens=3, draft_model=draft)
    outs = run_checked(engine, prompts, params, arrive_every=3)  # check_integrity covers the draft cache too
    assert [o.generated_tokens for o in outs] == expected
    stats = engine.stats()
    assert stats["preemptions"] > 0 and stats["prompt_tokens_cached"] > 0 and stats["draft_tokens"] > 0
    if draft_kind == "itself":
        assert stats["acceptance_rate"] > 0.95  # the same model drafts what it will choose
    (proposer,) = engine.speculator.draft_models.values()
    assert not proposer.kv.seqs and proposer.cache.pool.num_used_blocks == 0  # every mirror released


def test_a_draft_pool_too_small_drafts_less_and_stays_exact():
    model = tiny_model("qwen2")
    prompts = prompts_with_shared_prefix()
    expected = stock_greedy(model, prompts, MAX_NEW)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=40, max_num_batched_tokens=64))
    engine.speculator.num_blocks = 14  # the draft model's cache: about one request's worth
    outs = run_checked(engine, prompts, SamplingParams(max_new_tokens=MAX_NEW, num_speculative_tokens=4,
                                                       draft_model=model))
    assert [o.generated_tokens for o in outs] == expected
    assert 0 < engine.stats()["draft_tokens"] < 4 * MAX_NEW * len(prompts)


def test_draft_model_errors_fail_their_requests_only():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=8))
    torch.manual_seed(0)
    small_vocab = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2)).eval()
    broken = tiny_model("llama", seed=3)

    def explode(*args, **kwargs):
        raise RuntimeError("draft exploded")

    broken.forward = explode
    a = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6, num_speculative_tokens=2,
                                                    draft_model=small_vocab))
    b = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6, num_speculative_tokens=2, draft_model=broken))
    c = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6, num_speculative_tokens=2))
    outs = {}
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = {rid: engine.pop_output(rid) for rid in (a, b, c)}
    assert outs[a].status is RequestStatus.FAILED and "same tokenizer" in outs[a].error
    assert outs[b].status is RequestStatus.FAILED and "draft exploded" in outs[b].error
    assert outs[c].status is RequestStatus.FINISHED and len(outs[c].generated_tokens) == 6
    assert engine.cache.pool.num_used_blocks == 0
