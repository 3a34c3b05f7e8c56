"""Token healing: the prompt's last token is given back and the first generated token extends its text."""

from __future__ import annotations

import torch

import hf_paged
from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from hf_paged.programs.healing import HealingProcessor
from tests.processors.toy_tokenizers import byte_level_tokenizer
from tests.programs.conftest import wrapped_llama_over


@hp.program
def key_value(s, heal):
    s += 'Key: "name", value: ' + hp.gen("v", max_tokens=6, heal=heal)


def test_a_healed_field_equals_stock_generate_from_the_backed_up_prompt():
    tok = byte_level_tokenizer()
    model = wrapped_llama_over(tok)
    prompt = tok('Key: "name", value: ')["input_ids"]
    assert tok.decode(prompt[-1:]) == " "  # a lone space, which " \"" and "  " extend
    allowed = torch.tensor([tok.decode([i]).startswith(" ") for i in range(len(tok))])
    out = type(model).generate(model, torch.tensor([prompt[:-1]]), max_new_tokens=6, do_sample=False,
                               logits_processor=[HealingProcessor(len(prompt) - 1, allowed)],
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    new = [t for t in out[0, len(prompt) - 1:].tolist() if t != tok.eos_token_id]
    healed = key_value.run(model, tok, heal=True)
    assert healed.token_ids == prompt[:-1] + new
    assert tok.decode(new).startswith(" ") and healed["v"] == tok.decode(new)[1:]
    assert healed.text == 'Key: "name", value: ' + healed["v"]
    plain = key_value.run(model, tok, heal=False)
    assert plain.token_ids[: len(prompt)] == prompt  # without healing the prompt keeps its last token
    engine = engine_of(model)
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0
    hf_paged.unwrap(model)


def test_healing_leaves_a_token_nothing_extends_alone():
    tok = byte_level_tokenizer()
    model = wrapped_llama_over(tok)

    @hp.program
    def after_x(s):
        s += "value x" + hp.gen("v", max_tokens=3, heal=True)

    state = after_x.run(model, tok)
    prompt = tok("value x")["input_ids"]
    assert state.token_ids[: len(prompt)] == prompt  # "x" has no longer token: nothing to heal
    hf_paged.unwrap(model)
