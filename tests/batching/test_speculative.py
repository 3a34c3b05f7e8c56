"""Speculative decoding in the engine: drafting, rollback of rejected drafts, routing from `generate`, counts."""

import warnings

import pytest
import torch
from transformers import GenerationConfig

import hf_paged
from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.api.generate import PagedFallbackWarning
from hf_paged.batching.request import fork_ids
from hf_paged.batching.sampling import check_generation_config
from hf_paged.batching.speculative import Draft, NgramIndex
from hf_paged.errors import UnsupportedGenerationError
from tests.tiny_models import VOCAB, left_pad, ragged_prompts, stock_greedy, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def step_all(engine: Engine, on_step=None) -> None:
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
        if on_step is not None:
            on_step()


# -- prompt lookup ---------------------------------------------------------------------------------------
def test_ngram_index_proposes_what_followed_the_latest_longest_match():
    index = NgramIndex(max_ngram=3)
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6]
    assert index.propose(tokens, 3) == [7, 2, 6]  # "6" last followed at 7 (not at 2): latest occurrence
    tokens += [7]
    assert index.propose(tokens, 2) == [2, 6]  # "6 7": latest at 6..7, followed by 2
    tokens += [8]
    assert index.propose(tokens, 4) == [9, 1, 6, 7]  # "6 7 8" only at 1..3: the longest match wins over "8"
    assert index.propose([1, 2, 3], 2) == []  # (a fresh sequence would need a fresh index; none matches here)


def test_ngram_index_repeats_a_loop_and_grows_incrementally():
    index = NgramIndex(max_ngram=2)
    assert index.propose([4, 4], 5) == [4, 4, 4, 4, 4]  # period 1
    loop = [1, 2, 3, 1, 2, 3, 1]
    assert NgramIndex(2).propose(loop, 5) == [2, 3, 1, 2, 3]  # period 3, past the end of what was seen
    index = NgramIndex(2)
    seen = []
    for token in [3, 1, 4, 1, 5, 9, 2, 6]:
        seen.append(token)
        index.propose(seen, 1)
    assert index.num_indexed == 8
    assert index.propose(seen + [1], 2) == [5, 9]  # "1" last followed by 5 (at 4): the index kept up


# -- rollback --------------------------------------------------------------------------------------------
class FixedDrafter:
    """Drafts the expected greedy continuation with its token `num_right` replaced: exactly `num_right` kept."""

    def __init__(self, expected: dict[int, list[int]], num_right: int) -> None:
        self.expected, self.num_right = expected, num_right
        self.num_kept: dict[str, int] = {}  # request id -> drafts that should have been kept

    def propose(self, requests, num_tokens):
        drafts = []
        for request, k in zip(requests, num_tokens):
            self.num_kept[request.request_id] = self.num_kept.get(request.request_id, 0) + min(k, self.num_right)
            future = self.expected[len(request.prompt_ids)][len(request.output_ids):]
            draft = (future + [0] * k)[:k]
            if self.num_right < k:
                draft[self.num_right] = (draft[self.num_right] + 1) % VOCAB
            drafts.append(Draft(draft))
        return drafts

    def release(self, request_id):
        pass

    def check_integrity(self, live_ids):
        pass


@pytest.mark.parametrize("num_right", [0, 2, 5, 7])
def test_rejected_drafts_give_their_slots_and_blocks_back(model, num_right):
    prompts = ragged_prompts([9, 22], seed=5)
    expected = stock_greedy(model, prompts, 30)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=40))
    drafter = FixedDrafter({len(p): e for p, e in zip(prompts, expected)}, num_right)
    engine.speculator.prompt_lookup = drafter
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=30, num_speculative_tokens=7)) for p in prompts]

    def check_tables():
        for rid in ids:
            request = engine.requests[rid]
            if request.ended:
                continue
            assert request.num_computed_tokens == request.num_tokens - 1  # only the newest token is not computed
            table = engine.kv.block_ids(rid)
            assert len(table) == -(-request.num_computed_tokens // 4)  # no block past the last kept token
        used = sum(len(engine.kv.block_ids(rid)) for rid in ids if rid in engine.kv)
        assert engine.cache.pool.num_used_blocks == used  # nothing leaked, nothing shared by mistake

    engine.step()  # both prompts prefill and sample their first token
    step_all(engine, check_tables)
    outs = [engine.pop_output(rid) for rid in ids]
    assert [o.generated_tokens for o in outs] == expected
    for out in outs:
        assert out.num_accepted_tokens == drafter.num_kept[out.request_id]  # every step kept exactly num_right
    assert engine.cache.pool.num_used_blocks == 0


def test_drafts_stop_at_max_model_len(model):
    prompt = ragged_prompts([500], seed=6)[0]  # 512 positions: 12 left
    plain, spec = (Engine(model, PagedConfig(block_size=8)) for _ in range(2))
    a = plain.add_request(prompt, SamplingParams(max_new_tokens=40))
    b = spec.add_request(prompt, SamplingParams(max_new_tokens=40, num_speculative_tokens=15))
    step_all(plain)
    step_all(spec)
    x, y = plain.pop_output(a), spec.pop_output(b)
    assert y.generated_tokens == x.generated_tokens and len(x.generated_tokens) == 12
    assert y.finish_reason == x.finish_reason == "length"


def test_forks_speculate_each_on_its_own(model):
    prompt = ragged_prompts([13], seed=8)[0]
    engine = Engine(model, PagedConfig(block_size=4))
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=20, num_return_sequences=3,
                                                    num_speculative_tokens=4))
    step_all(engine)
    outs = [engine.pop_output(i) for i in fork_ids(rid, 3)]
    expected = stock_greedy(model, [prompt], 20)[0]
    assert [o.generated_tokens for o in outs] == [expected] * 3  # greedy forks agree
    assert all(o.num_draft_tokens > 0 for o in outs)


def test_forks_of_a_prompt_whose_last_chunk_is_one_token(model):
    """A 1-token last prompt chunk looks like a decode: it got drafts, its first token came through verification,
    where no fork was made, and the forks, made a step late, never ended and held every request after them (h53)."""
    prompt = [5, 6, 7, 8] * 4 + [5]  # 17 tokens, a budget of 8: chunks of 8, 8, then 1
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=8))
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=6, num_return_sequences=2, num_speculative_tokens=3))
    other = engine.add_request([9, 10, 11], SamplingParams(max_new_tokens=30), priority=-1)
    for _ in range(300):
        if not engine.has_unfinished:
            break
        engine.step()
        engine.check_integrity()
    assert not engine.has_unfinished
    expected = stock_greedy(model, [prompt], 6)[0]
    assert [engine.pop_output(i).generated_tokens for i in fork_ids(rid, 2)] == [expected] * 2
    assert engine.pop_output(other).generated_tokens == stock_greedy(model, [[9, 10, 11]], 30)[0]


# -- outputs and stats -----------------------------------------------------------------------------------
def test_counts_in_outputs_and_stats(model):
    engine = Engine(model, PagedConfig(block_size=8))
    prompts = ragged_prompts([12, 30, 5], seed=7)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=32, num_speculative_tokens=5)) for p in prompts]
    plain = engine.add_request(prompts[0], SamplingParams(max_new_tokens=32))  # no drafts for this one
    outs = engine.run(ids + [plain])
    stats = engine.stats()
    assert stats["draft_tokens"] == sum(o.num_draft_tokens for o in outs.values()) > 0
    assert stats["accepted_tokens"] == sum(o.num_accepted_tokens for o in outs.values()) > 0
    assert stats["acceptance_rate"] == pytest.approx(stats["accepted_tokens"] / stats["draft_tokens"])
    assert outs[plain].num_draft_tokens == 0 and outs[plain].acceptance_rate is None
    for rid in ids:
        out = outs[rid]
        assert out.acceptance_rate == pytest.approx(out.num_accepted_tokens / out.num_draft_tokens)
    assert Engine(model).stats()["acceptance_rate"] is None


# -- requests, generate, generate_batch ----------------------------------------------------------------
def test_sampling_params_check_the_speculative_fields():
    for bad in (-1, 16, True, 2.0):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            SamplingParams(num_speculative_tokens=bad)
    with pytest.raises(ValueError, match="draft_model needs num_speculative_tokens"):
        SamplingParams(draft_model=object())
    with pytest.raises(ValueError, match="prompt_lookup_max_ngram"):
        SamplingParams(num_speculative_tokens=2, prompt_lookup_max_ngram=0)
    params = SamplingParams.from_generation_config(
        GenerationConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=5, max_new_tokens=9))
    assert (params.num_speculative_tokens, params.prompt_lookup_max_ngram) == (6, 5)
    assert SamplingParams.from_generation_config(GenerationConfig(prompt_lookup_num_tokens=40)).num_speculative_tokens == 15
    with pytest.raises(UnsupportedGenerationError, match="assistant_early_exit"):
        check_generation_config(GenerationConfig(assistant_early_exit=2))


def test_wrapped_generate_runs_prompt_lookup_in_the_engine(model):
    prompts = ragged_prompts([3, 17, 33, 50], seed=1)
    ids, mask = left_pad(prompts)
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    hf_paged.wrap(model, block_size=8)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)
            out = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                                 prompt_lookup_num_tokens=4)
            outs = model.generate_batch(prompts, GenerationConfig(max_new_tokens=30, do_sample=False,
                                                                  prompt_lookup_num_tokens=4, eos_token_id=None))
        stats = hf_paged.engine_of(model).stats()
    finally:
        hf_paged.unwrap(model)
    assert torch.equal(out, stock)  # a batch of 4 with left padding: stock assisted decoding takes batch 1 only
    assert [o.generated_tokens for o in outs.values()] == [row[-30:] for row in stock.tolist()]
    assert stats["draft_tokens"] > 0 and stats["accepted_tokens"] > 0
    assert all(o.num_draft_tokens > 0 for o in outs.values())


def test_generate_with_an_assistant_model(model):
    prompts = ragged_prompts([3, 17, 33], seed=2)
    ids, mask = left_pad(prompts)
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    draft = tiny_model("llama", seed=1)  # another random model: most drafts rejected
    hf_paged.wrap(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)
            out = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                 assistant_model=draft, num_assistant_tokens=3)
            outs = model.generate_batch(prompts, GenerationConfig(max_new_tokens=20, do_sample=False,
                                                                  eos_token_id=None), assistant_model=draft)
        engine = hf_paged.engine_of(model)
        engine.check_integrity()
        stats = engine.stats()
    finally:
        hf_paged.unwrap(model)
    assert torch.equal(out, stock)
    assert [o.generated_tokens for o in outs.values()] == [row[-20:] for row in stock.tolist()]
    assert stats["draft_tokens"] > 0


def test_storage_that_cannot_roll_back_refuses_speculation(model):
    engine = Engine(model, PagedConfig(block_size=8, kv_cache_dtype="int8"))
    rid = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=4, num_speculative_tokens=2))
    out = engine.pop_output(rid)
    assert out.status is RequestStatus.FAILED and "kv_cache_dtype='auto'" in out.error
    hf_paged.wrap(model, kv_cache_dtype="int8")
    try:
        with pytest.warns(PagedFallbackWarning, match="speculative decoding needs uncompressed KV"):
            model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=2)
    finally:
        hf_paged.unwrap(model)


def test_a_failing_draft_model_fails_its_requests_only(model):
    class Broken(torch.nn.Module):
        pass

    engine = Engine(model, PagedConfig(block_size=8))
    bad = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=4, num_speculative_tokens=2,
                                                      draft_model=Broken()))
    good = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=4, num_speculative_tokens=2))
    outs = engine.run([bad, good])
    assert outs[bad].status is RequestStatus.FAILED and "not a transformers generative model" in outs[bad].error
    assert outs[good].status is RequestStatus.FINISHED


def test_scores_of_drafted_tokens_match_stock(model):
    """`output_scores` / `output_logits` hold one row per generated token, drafted or not."""
    prompts = ragged_prompts([6, 21], seed=4)
    ids, mask = left_pad(prompts)
    kwargs = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, return_dict_in_generate=True,
                  output_scores=True, output_logits=True)
    stock = model.generate(ids, **kwargs)
    hf_paged.wrap(model, block_size=4)
    try:
        ours = model.generate(ids, prompt_lookup_num_tokens=5, **kwargs)
        stats = hf_paged.engine_of(model).stats()
    finally:
        hf_paged.unwrap(model)
    assert stats["accepted_tokens"] > 0
    assert torch.equal(ours.sequences, stock.sequences)
    for mine, theirs in zip(ours.scores + ours.logits, stock.scores + stock.logits):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_scores_of_drafts_verified_past_a_stop_are_dropped(model, monkeypatch):
    """Verification judges every draft position and records its scores; an EOS among the kept drafts ends the
    request there, and the later positions' scores and logits go with their tokens: one per generated token."""
    from hf_paged.batching.speculative.prompt_lookup import PromptLookupProposer

    prompt = ragged_prompts([12], seed=3)[0]

    def run(params):
        engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
        rid = engine.add_request(prompt, params)
        step_all(engine)
        return engine.pop_output(rid)

    greedy = run(SamplingParams(max_new_tokens=12)).generated_tokens
    eos = next(t for i, t in enumerate(greedy) if i >= 2 and t not in greedy[:i])  # reached mid-way, first there

    def oracle(self, requests, num_tokens):  # drafts the greedy output itself: every draft kept, EOS among them
        return [Draft(greedy[len(r.output_ids):len(r.output_ids) + k]) for r, k in zip(requests, num_tokens)]

    monkeypatch.setattr(PromptLookupProposer, "propose", oracle)
    for k in (0, 4):
        out = run(SamplingParams(max_new_tokens=12, eos_token_id=eos, output_scores=True, output_logits=True,
                                 num_speculative_tokens=k))
        assert out.generated_tokens == greedy[:greedy.index(eos) + 1]
        assert len(out.scores) == len(out.logits) == len(out.generated_tokens), k
