"""Engine parity with stock generate under chunked prefill, preemption and arrivals between steps."""

import pytest
from transformers import GenerationConfig

import hf_paged
from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import FAMILIES, ragged_prompts, stock_greedy, tiny_model

LENGTHS = [5, 40, 23, 2, 61]
MAX_NEW = 24


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    model = tiny_model(request.param)
    prompts = ragged_prompts(LENGTHS, seed=3)
    return request.param, model, prompts, stock_greedy(model, prompts, MAX_NEW)


def run_checked(engine: Engine, ids) -> dict:
    """Step until done, checking the pool invariants after every step."""
    while any(not engine.requests[i].ended for i in ids):
        engine.step()
        engine.check_integrity()
    return {i: engine.pop_output(i) for i in ids}


@pytest.mark.parametrize("budget", [16, 64])
def test_generate_batch_chunked_prefill(family, budget):
    name, model, prompts, expected = family
    hf_paged.wrap(model, block_size=16, max_num_batched_tokens=budget)
    try:
        outs = model.generate_batch(prompts, GenerationConfig(max_new_tokens=MAX_NEW, do_sample=False))
        assert hf_paged.engine_of(model).stats()["tokens_per_step"] <= budget
    finally:
        hf_paged.unwrap(model)
    assert list(outs) == [f"req_{i}" for i in range(len(prompts))]
    assert [o.generated_tokens for o in outs.values()] == expected, name


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_parity(family, mode):
    name, model, prompts, expected = family
    # 14 blocks of 8 slots cannot hold all five requests (they need 19): someone must be preempted.
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=14, max_num_batched_tokens=32,
                                       preemption_mode=mode, enable_prefix_caching=False))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=MAX_NEW)) for p in prompts]
    outs = run_checked(engine, ids)
    assert engine.stats()["preemptions"] > 0
    assert [outs[i].generated_tokens for i in ids] == expected, name
    assert engine.cache.pool.num_free_blocks == 14


def test_requests_arriving_between_steps(family):
    name, model, prompts, expected = family
    engine = Engine(model, PagedConfig(block_size=4, max_num_batched_tokens=24))
    ids = [engine.add_request(prompts[0], SamplingParams(max_new_tokens=MAX_NEW))]
    for prompt in prompts[1:]:
        for _ in range(3):
            engine.step()
            engine.check_integrity()
        ids.append(engine.add_request(prompt, SamplingParams(max_new_tokens=MAX_NEW)))
    outs = run_checked(engine, ids)
    assert [outs[i].generated_tokens for i in ids] == expected, name
