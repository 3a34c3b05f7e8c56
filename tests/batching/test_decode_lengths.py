"""`scheduling_policy="remaining"`: parity with stock generate (plenty of memory, a tight pool, swap), its three
decisions on exact requests, and the typed error for an unknown policy."""

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.decode_lengths import DecodeLengths, remaining_new_tokens
from tests.tiny_models import FAMILIES, ragged_prompts, run_engine, stock_greedy, tiny_model

LENGTHS = [5, 40, 23, 2, 61]
NEWS = [24, 6, 17, 30, 9]  # ragged tails: the policy orders and reserves by them


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    model = tiny_model(request.param)
    prompts = ragged_prompts(LENGTHS, seed=3)
    return request.param, model, prompts, [stock_greedy(model, [p], n)[0] for p, n in zip(prompts, NEWS)]


def run_checked(engine: Engine, prompts) -> list[list[int]]:
    return run_engine(engine, prompts, list(NEWS[: len(prompts)]))


@pytest.mark.parametrize("setting", [
    {"max_num_batched_tokens": 16},  # chunked prefill, plenty of blocks
    {"block_size": 8, "num_blocks": 14, "max_num_batched_tokens": 32, "enable_prefix_caching": False},
    {"block_size": 8, "num_blocks": 14, "max_num_batched_tokens": 32, "preemption_mode": "swap"},
    {"block_size": "auto", "max_num_batched_tokens": 24},
])
def test_remaining_policy_keeps_parity(family, setting):
    name, model, prompts, expected = family
    engine = Engine(model, PagedConfig(scheduling_policy="remaining", **setting))
    assert run_checked(engine, prompts) == expected, name
    assert engine.cache.pool.num_used_blocks == 0


def test_tight_pool_reserves_instead_of_preempting():
    """14 blocks of 8 cannot hold all five requests: "budget" preempts, "remaining" admits only what can finish."""
    model = tiny_model("llama")
    prompts = ragged_prompts(LENGTHS, seed=3)
    tight = {"block_size": 8, "num_blocks": 14, "max_num_batched_tokens": 32, "enable_prefix_caching": False}
    budget = Engine(model, PagedConfig(**tight))
    remaining = Engine(model, PagedConfig(scheduling_policy="remaining", **tight))
    assert run_checked(budget, prompts) == run_checked(remaining, prompts)
    assert budget.stats()["preemptions"] > 0
    assert remaining.stats()["preemptions"] == 0


def test_decisions_on_exact_requests():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=32, scheduling_policy="remaining",
                                       enable_prefix_caching=False))
    a = engine.add_request([5] * 6, SamplingParams(max_new_tokens=10))
    b = engine.add_request([6] * 3, SamplingParams(max_new_tokens=3))
    engine.step()  # both prefill
    ra, rb = engine.requests[a], engine.requests[b]
    assert remaining_new_tokens(ra) == 9 and remaining_new_tokens(rb) == 2
    lengths = engine.scheduler.lengths
    assert isinstance(lengths, DecodeLengths)
    # The horizon is the shortest tail (b: 2 tokens). a: 6 prompt tokens stored in 2 blocks of 4; 2 more tokens
    # fit in them (0 blocks), its whole tail (to 6 + 10 - 1 = 15 tokens) would take 2 more. b: 3 stored in 1 block,
    # 2 more reach 5 tokens: 1 more block
    assert lengths.horizon([ra, rb]) == 2 and lengths.horizon([]) is None
    assert lengths.need(ra, 2) == 0 and lengths.need(ra, 9) == 2 and lengths.need(rb, 2) == 1
    assert lengths.reserve([ra, rb]) == (2, 1) and lengths.reserve([]) == (None, 0)
    order = sorted([ra, rb], key=lengths.order_key)
    assert order == [rb, ra]  # the shorter tail decodes first
    assert min([ra, rb], key=lengths.victim_key) is ra  # the longer tail yields its blocks first


def test_unknown_policy_is_a_typed_error():
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        PagedConfig(scheduling_policy="shortest")
