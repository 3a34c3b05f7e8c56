"""The step-time model with a query x key term (`step_times.py`): the fit recovers its terms from timed steps, a chunk
after a long context is cut shorter than a fresh one, and no chunk is starved; the tokens are one engine's."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import InProcessStore, StepTimes, TransferCostModel, fit_chunk
from hf_paged.kv_transfer.step_times import chunk_pairs
from tests.kv_transfer.test_engine_transfer import BS
from tests.tiny_models import ragged_prompts, stock_greedy

FIXED, PER_TOKEN, PER_PAIR = 0.004, 0.001, 1e-5  # seconds: 4 ms a chunk step, 1 ms a token, 1 ms per 100 pairs


def decode_only(n: int) -> float:
    return 0.015 + 0.0025 * n


def measured(steps: StepTimes, chunks: list[tuple[int, int]], decodes=(1, 7)) -> None:
    """Timed steps: decode-only ones, then each (tokens, context) chunk beside each decode count."""
    for n in (*decodes, *decodes):
        steps.observe(n, 0, decode_only(n))
    for n in decodes:
        for u, context in chunks:
            q = chunk_pairs(u, context)
            steps.observe(n + u, u, decode_only(n) + FIXED + PER_TOKEN * u + PER_PAIR * q, q)


def test_chunk_pairs_count_a_causal_chunk_after_its_context():
    assert chunk_pairs(1, 0) == 1 and chunk_pairs(4, 0) == 10 and chunk_pairs(4, 100) == 410


def test_the_fit_recovers_the_fixed_part_a_tokens_cost_and_a_pairs_cost():
    steps = StepTimes()
    measured(steps, [(4, 0), (16, 0), (2, 512), (8, 2048), (16, 2048), (4, 1024)])
    cost = steps.cost()
    assert cost.fixed == pytest.approx(FIXED, rel=1e-6)
    assert cost.per_token == pytest.approx(PER_TOKEN, rel=1e-6)
    assert cost.per_pair == pytest.approx(PER_PAIR, rel=1e-6)
    assert steps.pair_tokens == pytest.approx(PER_PAIR / PER_TOKEN)
    # the budget is the line's: ((1.5 - 1) x 32.5 ms - 4 ms) / 1 ms a token; the pairs price each chunk on top
    assert steps.budget(1.5, 7) == 12
    assert steps.max_pairs == chunk_pairs(16, 2048) and steps.pair_limit(16) == 2 * chunk_pairs(16, 2048)


def test_without_a_spread_of_pairs_the_model_is_the_line_in_tokens():
    steps = StepTimes()
    measured(steps, [(4, 0), (16, 0)])  # two fresh chunk sizes: tokens and pairs in one direction, no third term
    cost = steps.cost()
    for u in (4, 16):  # whatever the split between the terms, the steps it saw are predicted
        added = FIXED + PER_TOKEN * u + PER_PAIR * chunk_pairs(u, 0)
        assert cost.fixed + cost.per_token * u + cost.per_pair * chunk_pairs(u, 0) == pytest.approx(added)
    steps = StepTimes()
    for n in (1, 7, 1, 7):
        steps.observe(n, 0, decode_only(n))
    for n in (1, 7):  # no pairs given (0): the old line, fixed 4 ms + 0.75 ms a token
        steps.observe(n + 16, 16, decode_only(n) + 0.016)
        steps.observe(n + 4, 4, decode_only(n) + 0.007)
    cost = steps.cost()
    assert (cost.fixed, cost.per_token, cost.per_pair) == pytest.approx((0.004, 0.00075, 0.0))
    assert steps.pair_tokens == 0.0


def test_a_pair_term_of_the_wrong_sign_is_dropped():
    steps = StepTimes()
    for n in (1, 7, 1, 7):
        steps.observe(n, 0, decode_only(n))
    for u, context, extra in ((4, 0, 0.008), (16, 0, 0.020), (4, 1024, 0.007), (16, 1024, 0.019)):
        steps.observe(7 + u, u, decode_only(7) + extra, chunk_pairs(u, context))  # longer contexts cheaper: noise
    cost = steps.cost()
    assert cost.per_pair == 0.0 and cost.per_token == pytest.approx(0.001) and cost.fixed == pytest.approx(0.004,
                                                                                                          abs=1e-3)


def test_the_budget_shrinks_with_the_context_and_a_fresh_prompt_gets_more():
    k = PER_PAIR / PER_TOKEN  # 0.01 tokens a pair
    sizes = [fit_chunk(64, context, 20, k).num_tokens for context in (0, 64, 256, 1024, 4096)]
    assert sizes == [18, 11, 5, 1, 1]  # 18 fresh tokens: 18 + 0.01 x 171 pairs = 19.7 <= 20
    for context, n in zip((0, 64, 256, 1024), sizes):
        fit = fit_chunk(64, context, 20, k)
        assert fit.cost <= 20 and fit.cost >= n + k * chunk_pairs(n, context)  # its tokens and pairs, rounded up
        assert (n + 1) + k * chunk_pairs(n + 1, context) > 20  # one more token would not fit
    assert fit_chunk(64, 256, 20, 0.0).num_tokens == 20  # unmeasured pairs: tokens alone


def test_no_chunk_is_starved_and_a_spent_budget_moves_nothing():
    fit = fit_chunk(16, 4096, 3, 0.01)  # one token's attention alone (41 tokens' worth) is over the budget
    assert fit.num_tokens == 1 and fit.cost == 42  # it moves on; its cost takes the rest of the step's budget
    assert fit_chunk(16, 0, 0, 0.01).num_tokens == 0 and fit_chunk(0, 0, 10).num_tokens == 0
    assert fit_chunk(16, 2048, 100, 0.0, max_pairs=4096).num_tokens == 1  # 2 tokens: 4099 pairs, past the limit
    assert fit_chunk(16, 0, 100, 0.0, max_pairs=36).num_tokens == 8  # 8 fresh tokens: 36 pairs


def test_a_chunk_after_a_long_context_is_cut_shorter_and_the_tokens_are_one_engines(model):
    """Measured steps (injected, frozen): a pair costs 0.01 tokens; at ratio 1.5 a step of decodes may add 16 prompt
    tokens (the token bound; 20 by time). A fresh prompt takes 14 tokens in its first chunk; a prompt after a 160-token cached prefix is cut
    to what its attention leaves, and both answers are stock generate's."""
    prefix, fresh, shorts = ragged_prompts([20 * BS], seed=41)[0], *ragged_prompts([17], seed=42), ragged_prompts(
        [5, 9], seed=43)
    tail = prefix + ragged_prompts([9], seed=44)[0]  # 20 cached blocks, then 9 tokens to compute
    engine = Engine(model, PagedConfig(block_size=BS, max_prefill_tokens_per_step=16, max_prefill_step_time_ratio=1.5),
                    kv_store=InProcessStore())
    engine.run([engine.add_request(prefix, SamplingParams(max_new_tokens=1))])  # the prefix cache holds it
    connector = engine.scheduler.kv_transfer
    connector.cost = TransferCostModel(learn=False)
    steps = connector.cost.steps
    for _ in range(3):
        steps.observe(2, 0, 0.040)  # two decodes: 40 ms; a step may add 20 ms
    for u, context in ((2, 0), (16, 0), (4, 1024), (8, 512)):
        q = chunk_pairs(u, context)
        steps.observe(2 + u, u, 0.040 + PER_TOKEN * u + PER_PAIR * q, q)
    assert engine.scheduler._prompt_budget(2) == 16  # the token bound (20 by time)
    chunks: dict[str, list[int]] = {}
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        for item in out.scheduled:
            if item.num_tokens > 1:
                chunks.setdefault(item.request.request_id, []).append(item.num_tokens)
        return out

    engine.scheduler.schedule = spy
    results = {}
    for name, prompt in (("fresh", fresh), ("tail", tail)):
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in shorts]
        engine.step()  # the shorts decode from here on: steps are bounded
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=6))
        outs = engine.run([*ids, rid])
        results[name] = (chunks[rid], outs[rid].generated_tokens)
        engine.check_integrity()
    assert results["fresh"][0] == [14, 3]  # 14 + 0.01 x 105 pairs = 15.05 <= 16
    assert results["tail"][0] == [6, 3]  # 6 + 0.01 x (6 x 160 + 21) = 15.8 <= 16
    expected = stock_greedy(model, [fresh, tail], 6)
    assert [results["fresh"][1], results["tail"][1]] == expected


def test_a_pair_term_within_the_noise_is_left_out_and_a_prefill_tokens_cost_steadies_the_slope():
    steps = StepTimes()
    for n in (1, 7, 1, 7):
        steps.observe(n, 0, decode_only(n))
    noise = [0.003, -0.002, 0.0025, -0.003, 0.002, -0.0025]  # +-3 ms, no pair effect at all
    for (u, context), e in zip([(4, 0), (8, 512), (4, 1024), (8, 0), (4, 512), (8, 1024)], noise):
        steps.observe(7 + u, u, decode_only(7) + FIXED + PER_TOKEN * u + e, chunk_pairs(u, context))
    assert steps.cost().per_pair == 0.0  # 0.01 ms over 100 pairs is not what +-3 ms of noise can show
    few = StepTimes()
    for n in (1, 7, 1, 7):
        few.observe(n, 0, decode_only(n))
    few.observe(9, 2, decode_only(7) + 0.009)  # two noisy mixed steps: 9 ms for 2 tokens, 9.5 for 6
    few.observe(13, 6, decode_only(7) + 0.0095)
    assert few.cost().per_token == pytest.approx(0.000125)  # the line alone: an eighth of a millisecond a token
    few.prefill_token_seconds = PER_TOKEN  # a prefill step's token (the cost model's): 1 ms
    steadied = few.cost()  # ridge: (sum (u - mean u)(y - mean y) + 512 x 1 ms) / (sum (u - mean u)^2 + 512)
    assert steadied.per_token == pytest.approx((8 * 0.000125 + 512 * PER_TOKEN) / (8 + 512), rel=1e-3)  # (decay)
    assert 0.005 < steadied.fixed < 0.0055  # through the steps' mean (~4 tokens, ~9.25 ms) at that slope
