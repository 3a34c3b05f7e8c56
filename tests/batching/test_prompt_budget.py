"""While requests decode, a step carries at most `max_prefill_tokens_per_step` prompt tokens (bounded stalls)."""

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _recorded(engine):
    steps = []
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        steps.append({s.request.request_id: s.num_tokens for s in out.scheduled})
        return out

    engine.scheduler.schedule = spy
    return steps


@pytest.mark.parametrize(("limit", "chunks"), [(8, [8] * 11 + [4]), (64, [64, 28]), (None, [92])])
def test_long_prompt_is_spread_over_steps_while_others_decode(model, limit, chunks):
    """None (the default): no bound beyond the token budget."""
    short, long_ = ragged_prompts([10, 92], seed=3)
    engine = Engine(model, PagedConfig(block_size=4, max_num_batched_tokens=128, max_prefill_tokens_per_step=limit))
    steps = _recorded(engine)
    a = engine.add_request(short, SamplingParams(max_new_tokens=30))
    engine.step()
    assert steps[0] == {a: 10}  # an engine with nothing decoding prefills at the full budget
    b = engine.add_request(long_, SamplingParams(max_new_tokens=12))
    outs = engine.run([a, b])
    mixed = [s for s in steps[1:] if b in s and s[b] > 1]
    assert [s[b] for s in mixed] == chunks
    assert all(s.get(a) == 1 for s in mixed)  # a decodes in every one of them
    expected = stock_greedy(model, [short, long_], 30)
    assert outs[a].generated_tokens == expected[0]
    assert outs[b].generated_tokens == expected[1][:12]
    engine.check_integrity()


def test_prompt_budget_is_validated():
    with pytest.raises(ValueError, match="max_prefill_tokens_per_step"):
        PagedConfig(max_prefill_tokens_per_step=0)
