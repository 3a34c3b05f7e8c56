"""Log-probabilities of generated tokens (`SamplingParams.logprobs`): every entry equals a stock forward's
log_softmax at that position (fp32, within 1e-5), whatever the batch, schedule, preemption, forks, speculation,
constraint, stop string or retry around it; and asking for them changes no token."""

from __future__ import annotations

import pickle

import pytest
import torch

from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, SamplingParams
from hf_paged.batching.logprobs import MAX_LOGPROBS, TopLogprob, top_logprobs
from hf_paged.batching.request import fork_ids
from hf_paged.errors import InvalidConfigError
from tests.batching.test_constrained_engine import SCHEMA, model_and_tokenizer
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

ATOL = 1e-5


def reference(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """log_softmax of a stock forward over prompt + generated: row j is the distribution of generated token j."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) - 1 + len(generated)]


def check_entries(model, out, k: int) -> None:
    """`out.logprobs` covers exactly `out.generated_tokens` and matches the reference, top k included."""
    tokens = out.generated_tokens
    assert out.logprobs is not None and [e.token_id for e in out.logprobs] == tokens
    ref = reference(model, out.prompt_ids, tokens)
    for j, entry in enumerate(out.logprobs):
        assert abs(entry.logprob - float(ref[j, tokens[j]])) < ATOL, (j, entry.logprob, float(ref[j, tokens[j]]))
        assert len(entry.top) == k
        if k:
            values, ids = torch.topk(ref[j], k)
            assert [t.token_id for t in entry.top] == ids.tolist()
            assert torch.allclose(torch.tensor([t.logprob for t in entry.top]), values, atol=ATOL)


def run(engine: Engine, prompts, params) -> list:
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return outs


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.mark.parametrize("bad", [-1, MAX_LOGPROBS + 1, "3", 2.0, True])
def test_a_bad_logprobs_value_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidConfigError, match=r"SamplingParams\.logprobs"):
        SamplingParams(logprobs=bad)


def test_top_logprobs_breaks_ties_by_token_id():
    row = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, -1.0]])
    assert top_logprobs(row, [2]) == [[TopLogprob(1, 2.0), TopLogprob(3, 2.0)]]
    assert top_logprobs(row, [4]) == [[TopLogprob(1, 2.0), TopLogprob(3, 2.0), TopLogprob(4, 2.0),
                                       TopLogprob(2, 1.0)]]
    assert top_logprobs(row, [0]) == [[]]
    g = torch.Generator().manual_seed(0)
    for _ in range(200):  # many ties: every row equals a stable sort's first k
        vocab = int(torch.randint(1, 12, (1,), generator=g))
        rows = torch.randint(0, 4, (3, vocab), generator=g).float()
        ks = torch.randint(0, vocab + 2, (3,), generator=g).tolist()
        for row, k, got in zip(rows, ks, top_logprobs(rows, ks)):
            order = torch.sort(row, descending=True, stable=True)
            assert got == [TopLogprob(t, v) for t, v in zip(order.indices[:k].tolist(), order.values[:k].tolist())]


def test_greedy_entries_match_a_stock_forward_and_one_asking_row_changes_no_token(model):
    prompts = ragged_prompts([5, 17, 9, 30, 3], seed=2)
    expected = stock_greedy(model, prompts, 12)
    engine = Engine(model, PagedConfig(block_size=8, max_num_batched_tokens=32))  # chunked prefills too
    params = [SamplingParams(max_new_tokens=12, logprobs=3 if i == 1 else None) for i in range(len(prompts))]
    outs = run(engine, prompts, params)
    assert [o.generated_tokens for o in outs] == expected  # the master invariant, asking or not
    check_entries(model, outs[1], 3)
    assert all(o.logprobs is None for i, o in enumerate(outs) if i != 1)
    zero = run(engine, prompts[:1], SamplingParams(max_new_tokens=5, logprobs=0))[0]
    check_entries(model, zero, 0)


def test_seeded_sampling_draws_the_same_tokens_with_entries_of_the_raw_distribution(model):
    prompts = ragged_prompts([6, 11], seed=3)
    sampled = SamplingParams(max_new_tokens=10, do_sample=True, temperature=0.7, top_k=20, seed=5)
    engine = Engine(model, PagedConfig(block_size=8))
    plain = run(engine, prompts, sampled)
    asked = run(engine, prompts, sampled.replace(logprobs=4))
    assert [o.generated_tokens for o in asked] == [o.generated_tokens for o in plain]
    for out in asked:  # raw: before temperature and top-k
        check_entries(model, out, 4)


def test_forks_each_get_their_own_entries(model):
    (prompt,) = ragged_prompts([9], seed=4)
    engine = Engine(model, PagedConfig(block_size=8))
    params = SamplingParams(max_new_tokens=8, do_sample=True, seed=11, num_return_sequences=2, logprobs=2)
    rid = engine.add_request(prompt, params)
    outs = engine.run()
    assert list(outs) == fork_ids(rid, 2)
    a, b = outs.values()
    assert a.generated_tokens != b.generated_tokens  # different draws
    for out in (a, b):
        check_entries(model, out, 2)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_entries_survive_preemption(model, mode):
    prompts = ragged_prompts([20, 25, 18, 22], seed=5)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=14, max_num_batched_tokens=32, preemption_mode=mode,
                                       enable_prefix_caching=False))
    outs = run(engine, prompts, SamplingParams(max_new_tokens=24, logprobs=2))
    assert engine.stats()["preemptions"] > 0
    assert [o.generated_tokens for o in outs] == stock_greedy(model, prompts, 24)
    for out in outs:
        check_entries(model, out, 2)


@pytest.mark.parametrize("sample", [False, True])
def test_speculative_tokens_get_entries_from_the_verification_rows(model, sample):
    base = ragged_prompts([6], seed=6)[0]
    prompt = base * 5  # repetitive: prompt lookup drafts, and greedy decoding keeps some drafts
    params = SamplingParams(max_new_tokens=20, num_speculative_tokens=4, logprobs=3, do_sample=sample, seed=3)
    engine = Engine(model, PagedConfig(block_size=8))
    (out,) = run(engine, [prompt], params)
    assert out.num_draft_tokens > 0
    if not sample:
        assert out.num_accepted_tokens > 0
        assert out.generated_tokens == stock_greedy(model, [prompt], 20)[0]
    check_entries(model, out, 3)


def test_a_stop_string_cuts_entries_with_the_tokens():
    model, tok = model_and_tokenizer()
    prompt = tok("Hello there, ")["input_ids"]
    free = run(Engine(model, PagedConfig(block_size=8)), [prompt], SamplingParams(max_new_tokens=12, logprobs=1))[0]
    stop = tok.decode(free.generated_tokens[3:5])  # a string the greedy output reaches at its 5th token
    params = SamplingParams(max_new_tokens=12, logprobs=1, stop_strings=[stop], tokenizer=tok)
    (out,) = run(Engine(model, PagedConfig(block_size=8)), [prompt], params)
    assert out.finish_reason == "stop" and len(out.generated_tokens) <= 5
    check_entries(model, out, 1)
    assert out.logprobs == free.logprobs[: len(out.generated_tokens)]


def test_a_json_schema_request_reports_raw_logprobs_of_the_constrained_tokens():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    prompt = tok("Pets: ")["input_ids"]
    params = SamplingParams(max_new_tokens=40, eos_token_id=tok.eos_token_id, logits_processors=[proc], logprobs=2)
    engine = Engine(model, PagedConfig(block_size=8))
    (out,) = run(engine, [prompt], params)
    (plain,) = run(engine, [prompt], params.replace(logprobs=None))  # jump-forward on: the same document
    assert out.generated_tokens == plain.generated_tokens
    check_entries(model, out, 2)  # raw: the chosen token is the constraint's, the values the model's
    assert any(e.top[0].token_id != e.token_id for e in out.logprobs)  # the constraint overrode the model


def test_retries_report_the_entries_of_the_final_attempt():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    seen = []

    def validator(text):
        seen.append(text)
        return len(seen) > 1

    params = SamplingParams(max_new_tokens=40, do_sample=True, seed=2, eos_token_id=tok.eos_token_id,
                            logits_processors=[proc], logprobs=1, max_retries=2, validator=validator, tokenizer=tok)
    engine = Engine(model, PagedConfig(block_size=8))
    (out,) = run(engine, [tok("Pets: ")["input_ids"]], params)
    assert len(out.attempts) == 2
    check_entries(model, out, 1)


def test_scoring_with_logprobs_gives_each_position_its_top_k(model):
    (prompt,) = ragged_prompts([14], seed=8)
    prompt[12] = int(reference(model, prompt[:12], [0])[0].argmax())  # target 3 is the most likely token
    targets = prompt[9:]
    engine = Engine(model, PagedConfig(block_size=8, max_num_batched_tokens=8))  # scored across two chunks
    (out,) = run(engine, [prompt[:-1]], SamplingParams(score_targets=targets, logprobs=3))
    ref = reference(model, prompt[:9], targets)
    assert torch.allclose(torch.tensor(out.score_logprobs), ref.gather(1, torch.tensor(targets)[:, None])[:, 0],
                          atol=ATOL)
    assert out.logprobs is None and len(out.score_top_logprobs) == len(targets)
    for j, top in enumerate(out.score_top_logprobs):
        assert [t.token_id for t in top] == torch.topk(ref[j], 3).indices.tolist()
        for t in top:  # a target among its alternatives has the very same value (clients compare them)
            if t.token_id == targets[j]:
                assert t.logprob == out.score_logprobs[j]
    assert out.score_top_logprobs[3][0].logprob == out.score_logprobs[3]  # the greedy target checked above


def test_generate_batch_takes_logprobs_through_sampling_params():
    import hf_paged

    model = tiny_model("llama", seed=3)
    prompts = ragged_prompts([7, 12], seed=9)
    hf_paged.wrap(model, block_size=8, num_blocks=64)
    try:
        outs = model.generate_batch(prompts, sampling_params=[SamplingParams(max_new_tokens=6, logprobs=2),
                                                              SamplingParams(max_new_tokens=6)])
    finally:
        hf_paged.unwrap(model)
    first, second = outs.values()
    check_entries(model, first, 2)
    assert second.logprobs is None
    assert pickle.loads(pickle.dumps(first)).logprobs == first.logprobs  # outputs cross processes (distributed, Ray)
    assert [o.generated_tokens for o in outs.values()] == stock_greedy(model, prompts, 6)
