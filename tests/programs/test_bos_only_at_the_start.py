"""On a tokenizer that adds BOS (the embedded model's), a program's token ids are the ones a user would build for
stock `generate`: BOS once, before the first text, and a program whose first call comes before any text prompts
the model with BOS alone, as `generate` from BOS does (not refused as "no text before it")."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_paged
from hf_paged import programs as hp
from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.api.wrap_state import engine_of
from tests.programs.test_programs import _stock_greedy


@pytest.fixture(scope="module")
def bos_model_tok():
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float32).eval()
    assert tok("a")["input_ids"][0] == tok.bos_token_id  # the premise: this tokenizer adds BOS
    hf_paged.wrap(model, block_size=8, num_blocks=128)
    yield model, tok
    engine = engine_of(model)
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0


def test_bos_once_before_the_first_text_and_never_before_later_text(bos_model_tok):
    model, tok = bos_model_tok

    @hp.program
    def two(s):
        s += "The river" + hp.gen("a", max_tokens=6)
        s += " and the stone" + hp.gen("b", max_tokens=6)

    state = two.run(model, tok)
    first_prompt = tok("The river")["input_ids"]
    a = _stock_greedy(model, tok, first_prompt, 6)
    second_prompt = first_prompt + a + tok(" and the stone", add_special_tokens=False)["input_ids"]
    b = _stock_greedy(model, tok, second_prompt, 6)
    assert state.token_ids == second_prompt + b
    assert state.token_ids.count(tok.bos_token_id) == 1
    assert state["a"] == tok.decode(a) and state["b"] == tok.decode(b)


def test_a_first_call_before_any_text_prompts_with_bos_alone(bos_model_tok):
    model, tok = bos_model_tok

    @hp.program
    def from_nothing(s):
        s += hp.gen("opening", max_tokens=8)

    state = from_nothing.run(model, tok)
    expected = _stock_greedy(model, tok, [tok.bos_token_id], 8)
    assert state.token_ids == [tok.bos_token_id] + expected
    assert state["opening"] == tok.decode(expected) and state.text == state["opening"]
