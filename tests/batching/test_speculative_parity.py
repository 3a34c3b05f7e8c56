"""Speculative decoding keeps greedy output token-identical to stock `generate`, with chunked prefill, preemption
and prefix hits in the same run, and leaves the pool clean (`check_integrity` after every step)."""

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import FAMILIES, ragged_prompts, stock_greedy, tiny_model

MAX_NEW = 24


def prompts_with_shared_prefix() -> list[list[int]]:
    """Five prompts; the last three share a 29-token prefix (prefix hits once the first of them is cached)."""
    shared = ragged_prompts([29], seed=41)[0]
    return ragged_prompts([5, 40], seed=3) + [shared + q for q in ragged_prompts([3, 11, 2], seed=42)]


def run_checked(engine: Engine, prompts, params: SamplingParams, *, arrive_every: int = 0) -> list:
    """Add the prompts (`arrive_every` steps apart when > 0), step until done; `check_integrity` after every step."""
    ids = []
    for prompt in prompts:
        ids.append(engine.add_request(prompt, params))
        for _ in range(arrive_every):
            engine.step()
            engine.check_integrity()
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return [engine.pop_output(i) for i in ids]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    model = tiny_model(request.param)
    prompts = prompts_with_shared_prefix()
    return request.param, model, prompts, stock_greedy(model, prompts, MAX_NEW)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_prompt_lookup_parity_with_chunked_prefill_preemption_and_prefix_hits(family, mode):
    name, model, prompts, expected = family
    # budget 16: prompts prefill in chunks; 16 blocks of 4 hold about two requests: preemption; the shared prefix
    # of the last three prompts is cached by the time they arrive (3 steps apart): prefix hits
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=16, max_num_batched_tokens=16, preemption_mode=mode))
    params = SamplingParams(max_new_tokens=MAX_NEW, num_speculative_tokens=4, prompt_lookup_max_ngram=3)
    outs = run_checked(engine, prompts, params, arrive_every=3)
    assert [o.generated_tokens for o in outs] == expected, name
    stats = engine.stats()
    assert stats["preemptions"] > 0 and stats["prompt_tokens_cached"] > 0, stats
    # drafts kept (and, in most families' runs, some rolled back: how many depends on the schedule, and a run where
    # every proposed draft is right is fine; rejection itself is test_speculative's `test_rejected_drafts_...`)
    assert stats["draft_tokens"] >= stats["accepted_tokens"] > 0, stats
    assert stats["steps"] > max(len(p) for p in prompts) // 16  # chunked
    assert engine.cache.pool.num_used_blocks == 0  # every block back (the cached ones idle, reusable)


def test_multi_turn_hits_blocks_written_while_speculating(family):
    """The second turn's prompt is the first turn's prompt and answer: its prefix hits are blocks whose tokens
    were verified drafts. Wrong K/V there (a rejected draft's) would change its greedy output."""
    name, model, prompts, _ = family
    engine = Engine(model, PagedConfig(block_size=4, max_num_batched_tokens=64))
    params = SamplingParams(max_new_tokens=MAX_NEW, num_speculative_tokens=6, prompt_lookup_max_ngram=2)
    first = run_checked(engine, prompts[1:2], params)[0]
    second_prompt = prompts[1] + first.generated_tokens
    second = run_checked(engine, [second_prompt], params)[0]
    assert second.num_cached_tokens >= len(prompts[1])  # hit past the first prompt, into the answer
    assert second.generated_tokens == stock_greedy(model, [second_prompt], MAX_NEW)[0], name
    assert first.num_accepted_tokens + second.num_accepted_tokens > 0


def test_speculation_matches_engine_without_it_at_every_draft_length():
    model = tiny_model("llama")
    prompts = ragged_prompts([7, 30, 18, 55, 3, 41], seed=9)
    expected = stock_greedy(model, prompts, 40)
    for k in (1, 3, 8, 15):
        engine = Engine(model, PagedConfig(block_size=8, max_num_batched_tokens=48))
        outs = run_checked(engine, prompts, SamplingParams(max_new_tokens=40, num_speculative_tokens=k))
        assert [o.generated_tokens for o in outs] == expected, k
        assert all(len(o.generated_tokens) == 40 for o in outs)  # max_new_tokens is exact, drafts or not
