"""Token healing and stop strings: the engine matches a stop string in the request's output, and a healed output
starts with the prompt's backed-up token (`lead`). A stop string that the lead could take part in (inside the lead,
or starting inside it: lead ":/" and stop "/" or "//") would end the field at its first token, on text that is the
prompt's, not the field's. Such a field is generated without healing: the same as `heal=False`, where the stop
string is looked for in the field's own text only (as it is for every other field)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

import hf_paged
from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from tests.processors.toy_tokenizers import byte_level_bpe
from tests.programs.conftest import wrapped_llama_over


def _tokenizer() -> PreTrainedTokenizerFast:
    # "http:/" ends with the token ":/", which "://" extends: healing backs it up
    tok = byte_level_bpe([(":", "/"), (":/", "/")], ("<eos>",))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@hp.program
def link(s, heal, stop):
    s += "Link: http:/" + hp.gen("rest", max_tokens=6, heal=heal, stop=stop)


@pytest.mark.parametrize("stop", ["/", "//", ":/"], ids=["inside_the_lead", "starts_inside_the_lead", "the_lead"])
def test_a_stop_string_the_healed_lead_could_hit_turns_healing_off(stop):
    tok = _tokenizer()
    prompt = tok("Link: http:/")["input_ids"]
    assert tok.decode(prompt[-1:]) == ":/"  # the lead healing would back up ("://" extends it)
    model = wrapped_llama_over(tok)
    healed = link.run(model, tok, heal=True, stop=stop)
    plain = link.run(model, tok, heal=False, stop=stop)
    assert healed.token_ids[: len(prompt)] == prompt  # the prompt keeps its last token
    assert healed.token_ids == plain.token_ids
    assert healed["rest"] == plain["rest"] and healed.text == plain.text
    assert healed.calls[0].finish_reason == plain.calls[0].finish_reason
    assert healed.calls[0].tokens.generated == plain.calls[0].tokens.generated > 1  # not ended at its first token
    engine = engine_of(model)
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0
    hf_paged.unwrap(model)


@pytest.mark.parametrize("stop", ["zz", "x:/"])
def test_a_stop_string_that_cannot_begin_inside_the_lead_keeps_healing(stop):
    tok = _tokenizer()
    prompt = tok("Link: http:/")["input_ids"]
    model = wrapped_llama_over(tok)
    healed = link.run(model, tok, heal=True, stop=stop)  # ("x:/" holds the lead, but no match can begin in it)
    assert healed.token_ids[: len(prompt) - 1] == prompt[:-1]
    assert tok.decode(healed.token_ids[len(prompt) - 1:]).startswith(":/")  # healed: the output starts with it
    assert healed.text == "Link: http:/" + healed["rest"]
    hf_paged.unwrap(model)
