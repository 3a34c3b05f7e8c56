"""The scoring path (`model.loglikelihood` / `loglikelihood_rolling`): equal to a stock forward, contexts computed
once, scoring beside generation, bad input refused by name."""

from __future__ import annotations

import pytest
import torch

import hf_paged
from hf_paged.api.scoring import rolling_windows
from hf_paged.errors import InvalidPromptError, PromptTooLongError
from tests.tiny_models import VOCAB, ragged_prompts, stock_greedy, tiny_model


def _stock_scores(model, pairs):
    """(summed log-prob, greedy, per-token log-probs) of each continuation from one stock forward per pair."""
    out = []
    with torch.no_grad():
        for context, continuation in pairs:
            logits = model(torch.tensor([context + continuation[:-1]])).logits[0].float()
            rows = torch.log_softmax(logits, -1)[len(context) - 1 :]
            target = torch.tensor(continuation)
            per_token = rows.gather(1, target[:, None]).squeeze(1)
            out.append((per_token.sum().item(), bool((rows.argmax(-1) == target).all()), per_token.tolist()))
    return out


def _choices(seed: int, context_lengths=(40, 75, 3), choice_lengths=(1, 4, 9, 13)):
    g = torch.Generator().manual_seed(seed)
    contexts = ragged_prompts(context_lengths, seed=seed)
    return [(c, torch.randint(3, VOCAB, (n,), generator=g).tolist()) for c in contexts for n in choice_lengths]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("block_size,budget", [(16, 32), (8, 1024)])
def test_loglikelihood_equals_stock_forward(family, block_size, budget):
    model = tiny_model(family)
    pairs = _choices(seed=2)
    reference = _stock_scores(model, pairs)
    hf_paged.wrap(model, block_size=block_size, max_num_batched_tokens=budget)  # chunked prefill when 32
    results = model.loglikelihood(pairs, token_logprobs=True)
    for (logprob, greedy, per_token), result in zip(reference, results):
        assert result.logprob == pytest.approx(logprob, abs=1e-4)
        assert result.is_greedy == greedy
        assert result.token_logprobs == pytest.approx(per_token, abs=1e-4)
    assert model.loglikelihood(pairs)[0].token_logprobs is None


def test_greedy_continuation_is_greedy_and_a_changed_token_is_not():
    model = hf_paged.wrap(tiny_model("llama"))
    context = ragged_prompts([30], seed=4)[0]
    greedy = stock_greedy(model, [context], 6)[0]
    other = greedy[:-1] + [(greedy[-1] + 1) % VOCAB]
    same, changed = model.loglikelihood([(context, greedy), (context, other)])
    assert same.is_greedy and not changed.is_greedy
    assert same.logprob > changed.logprob


def test_choices_share_their_context():
    """Four choices after one long context: the context is computed once (its last partial block again per choice),
    not four times."""
    model = hf_paged.wrap(tiny_model("llama"), block_size=16)
    contexts = ragged_prompts([300, 200], seed=6)
    g = torch.Generator().manual_seed(0)
    pairs = [(c, torch.randint(3, VOCAB, (12,), generator=g).tolist()) for c in contexts for _ in range(4)]
    reference = _stock_scores(model, pairs)
    engine = hf_paged.engine_of(model)
    before = engine.metrics.num_computed_tokens
    results = model.loglikelihood(pairs)
    computed = engine.metrics.num_computed_tokens - before
    naive = sum(len(c) + len(x) - 1 for c, x in pairs)
    assert computed <= 0.35 * naive, (computed, naive)
    assert [r.logprob for r in results] == pytest.approx([r[0] for r in reference], abs=1e-4)


def test_scoring_under_preemption_and_beside_generation():
    """A pool too small for everything at once (preemptions) and generating requests in the same steps: scores equal
    to stock, generated tokens equal to stock."""
    model = tiny_model("llama")
    pairs = _choices(seed=3, context_lengths=(60, 90, 120))
    reference = _stock_scores(model, pairs)
    prompts = ragged_prompts([20, 50], seed=9)
    expected = stock_greedy(model, prompts, 60)
    hf_paged.wrap(model, block_size=8, num_blocks=22, max_num_batched_tokens=64)
    engine = hf_paged.engine_of(model)
    submission = engine.loop.submit(prompts, [hf_paged.SamplingParams(max_new_tokens=60)] * 2)
    results = model.loglikelihood(pairs)
    generated = [out.generated_tokens for out in submission.result().values()]
    assert generated == expected
    assert engine.scheduler.num_preemptions > 0
    assert [r.logprob for r in results] == pytest.approx([r[0] for r in reference], abs=1e-4)


def test_rolling_windows_cover_every_token_once():
    tokens = list(range(10, 33))
    for max_length in (1, 4, 7, 23, 50):
        windows = rolling_windows(tokens, 1, max_length)
        assert [t for _, continuation in windows for t in continuation] == tokens
        assert windows[0][0] == [1]
        for context, continuation in windows:
            assert len(context) + len(continuation) - 1 <= max_length
            if context != [1]:  # a later window's context is the text just before its continuation
                start = tokens.index(continuation[0])
                assert context == tokens[start - len(context) : start]


def test_rolling_windows_match_lm_eval():
    utils = pytest.importorskip("lm_eval.utils")
    tokens = list(range(100, 161))
    for max_length in (1, 5, 16, 61, 64):
        theirs = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(tokens, 1, max_length, 1)]
        assert rolling_windows(tokens, 1, max_length) == [(list(a), list(b)) for a, b in theirs]


def test_loglikelihood_rolling_sums_the_windows():
    model = tiny_model("qwen2")
    documents = ragged_prompts([1, 37, 200], seed=11)
    expected = []
    for document in documents:
        windows = rolling_windows(document, 1, 64)
        expected.append(sum(score for score, _, _ in _stock_scores(model, windows)))
    hf_paged.wrap(model, max_num_batched_tokens=48)
    results = model.loglikelihood_rolling(documents, max_length=64, token_logprobs=True)
    assert [r.logprob for r in results] == pytest.approx(expected, abs=1e-4)
    assert [len(r.token_logprobs) for r in results] == [1, 37, 200]
    whole = model.loglikelihood_rolling(documents[1:2])[0]  # default: the model's positions, BOS prefix
    assert whole.logprob == pytest.approx(_stock_scores(model, [([1], documents[1])])[0][0], abs=1e-4)


def test_rolling_windows_that_fit_a_step_are_never_split():
    """A window (scoring prompt) that a whole step's budget holds runs in one step, one causal attention: when what
    is left of a step is too small, it waits for the next instead of being chunked."""
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(13)
    documents = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (1, 37, 200, 90, 64)]
    expected = [sum(score for score, _, _ in _stock_scores(model, rolling_windows(d, 1, 64))) for d in documents]
    hf_paged.wrap(model, max_num_batched_tokens=64, num_blocks=128)  # one wave: every window queued at once
    engine = hf_paged.engine_of(model)
    schedule, chunks = engine.scheduler.schedule, []

    def recording():
        out = schedule()
        chunks.extend((item.num_tokens, item.request.num_tokens_to_compute) for item in out.scheduled)
        assert out.num_batched_tokens <= 64
        return out

    engine.scheduler.schedule = recording
    results = model.loglikelihood_rolling(documents, max_length=64)
    assert [r.logprob for r in results] == pytest.approx(expected, abs=1e-4)
    assert len(chunks) == sum(len(rolling_windows(d, 1, 64)) for d in documents)  # one chunk per window
    assert all(n == whole for n, whole in chunks)  # (the 1-token first window leaves 63: a 64-token one waited)
    engine.check_integrity()


@pytest.mark.parametrize("pair,error,words", [
    (([5, 6], []), InvalidPromptError, "continuation 1 is empty"),
    (([], [5]), InvalidPromptError, "context 1 is empty"),
    (("some text", [5]), InvalidPromptError, "encode it first"),
    (([5, VOCAB + 3], [5]), InvalidPromptError, "outside the vocabulary"),
    (([5] * 600, [6]), PromptTooLongError, "cut the context from the left"),
    ((None, [5]), InvalidPromptError, "not a list of token ids"),
    ([[5]], InvalidPromptError, "request 1 is not a (context_ids, continuation_ids) pair"),
    ({"context": [5], "continuation": [6]}, InvalidPromptError, "request 1 is a dict"),  # (was: "context 1 is text")
    (([5, True], [6]), InvalidPromptError, "not a list of token ids"),  # (True was scored as token 1)
    (([5, 6], [3.0]), InvalidPromptError, "continuation 1 is not a list of token ids (list): it holds 3.0 (float)"),
    (([5, True], [6]), InvalidPromptError, "it holds True (bool)"),
    (({"input_ids": [5]}, [6]), InvalidPromptError, "tokenizer(text).input_ids"),
])
def test_bad_pairs_are_refused_by_name(pair, error, words):
    model = hf_paged.wrap(tiny_model("llama"))
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        model.loglikelihood([([1, 2], [3]), pair])
    assert model.loglikelihood([([1, 2], [3])])[0].logprob < 0  # the engine is fine afterwards


def test_rolling_refuses_bad_documents_and_lengths():
    model = hf_paged.wrap(tiny_model("llama"))
    with pytest.raises(InvalidPromptError, match="document 1 is empty"):
        model.loglikelihood_rolling([[4, 5], []])
    with pytest.raises(ValueError, match="max_length must be an int in"):
        model.loglikelihood_rolling([[4, 5]], max_length=10**6)
    with pytest.raises(InvalidPromptError, match="prefix_token_id=999"):  # (it named "request 0: token ids [999]")
        model.loglikelihood_rolling([[4, 5]], prefix_token_id=999)
    with pytest.raises(InvalidPromptError, match=rf"document 2: token ids \[{VOCAB + 3}\] are outside the vocabulary"):
        model.loglikelihood_rolling([[5] * 600, [6] * 10, [7, 8, VOCAB + 3]])  # (it named "request 3", a window)
    with pytest.raises(InvalidPromptError, match=r"document 0 is not a list of token ids \(list\): it holds 1.5"):
        model.loglikelihood_rolling([[4, 1.5]])


def test_unwrap_removes_the_scoring_methods():
    model = hf_paged.wrap(tiny_model("llama"))
    hf_paged.unwrap(model)
    assert not hasattr(model, "loglikelihood") and not hasattr(model, "loglikelihood_rolling")


def test_a_scored_sequence_may_fill_the_pool_exactly():
    """A scoring request generates nothing: a prompt of exactly the pool's slots fits (a generating one needs one
    more slot for its first token)."""
    model = tiny_model("llama")
    context, continuation = ragged_prompts([20, 13], seed=12)
    reference = _stock_scores(model, [(context, continuation)])[0][0]
    hf_paged.wrap(model, block_size=8, num_blocks=4, max_num_batched_tokens=16)
    assert model.loglikelihood([(context, continuation)])[0].logprob == pytest.approx(reference, abs=1e-4)
    with pytest.raises(PromptTooLongError, match="needs 5 blocks but the pool has 4"):
        model.loglikelihood([(context, continuation + [7])])


def test_the_same_documents_scored_again_reuse_the_later_windows_contexts():
    """A later rolling window's context (the text before its scored tokens) is an ordinary prefix: scored again on
    the same engine, its tokens come from the prefix cache up to the last one (whose logits score the first
    continuation token), so only the scored rows are computed; the log-likelihoods are the same. (So an A/B of
    repeated calls on one engine measures less work than a fresh evaluation: `benchmarks/lm_eval_ppl_ab.py` builds
    a fresh engine per call.)"""
    model = tiny_model("llama")
    documents = ragged_prompts([150, 100, 64], seed=14)
    hf_paged.wrap(model, block_size=8, max_num_batched_tokens=64)
    engine = hf_paged.engine_of(model)
    windows = [w for d in documents for w in rolling_windows(d, 1, 64)]
    prompt_tokens = sum(len(c) + len(x) - 1 for c, x in windows)
    counts, results = [], []
    for _ in range(2):
        before = engine.metrics.num_computed_tokens
        results.append([r.logprob for r in model.loglikelihood_rolling(documents, max_length=64)])
        counts.append(engine.metrics.num_computed_tokens - before)
    assert counts[0] == prompt_tokens  # a fresh engine: no window shares a prefix with another
    reused = sum(len(c) - 1 for c, _ in windows)  # every context token but the last (the first scored row)
    assert reused > 0 and counts[1] == prompt_tokens - reused, (counts, prompt_tokens, reused)
    assert results[1] == pytest.approx(results[0], abs=1e-4)
    engine.check_integrity()
