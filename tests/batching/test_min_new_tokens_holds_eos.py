"""`min_new_tokens` holds EOS back for exactly that many tokens, on every path a row's pick can take (plain greedy
with processors, sampled rows drawn together, seeded rows, speculative verification): EOS is chosen as the
`min_new_tokens`-th token's argmax, so one token of slack either way changes where the request ends. Stock
`generate` with the same `min_new_tokens` and `eos_token_id` is the reference."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

MIN_NEW = 3


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama")
    prompt = ragged_prompts([11], seed=7)[0]
    free = stock_greedy(model, [prompt], 12)[0]
    # EOS: the token greedy decoding picks at output position MIN_NEW - 1 (the last one EOS is held back from)
    eos = free[MIN_NEW - 1]
    assert eos not in free[: MIN_NEW - 1], "pick a prompt whose EOS candidate does not come earlier"
    expected = stock_greedy(model, [prompt], 12, min_new_tokens=MIN_NEW, eos_token_id=eos)[0]
    assert len(expected) > MIN_NEW and expected[MIN_NEW - 1] != eos  # stock held it back
    return model, prompt, eos, expected


@pytest.mark.parametrize("kwargs", [
    {},  # greedy: the row goes through the processor chain while EOS is held back
    {"do_sample": True, "top_k": 1},  # unseeded sampled rows, drawn together (top_k=1: the argmax)
    {"do_sample": True, "top_k": 1, "seed": 5},  # seeded draws, row by row
    {"num_speculative_tokens": 3},  # speculative verification (prompt lookup)
], ids=["greedy", "sampled", "seeded", "speculative"])
def test_eos_is_held_back_for_exactly_min_new_tokens(setup, kwargs):
    model, prompt, eos, expected = setup
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=32))
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=12, min_new_tokens=MIN_NEW, eos_token_id=eos,
                                                    **kwargs))
    out = engine.run([rid])[rid]
    assert out.generated_tokens == expected
    engine.check_integrity()
