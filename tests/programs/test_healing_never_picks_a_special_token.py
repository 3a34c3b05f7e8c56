"""Token healing lets the first generated token be any token whose text extends the backed-up one, but never a
special token: after a prompt ending in "<", "<|end|>" decodes to text starting with "<", yet it is a marker, not a
continuation of the text. It was allowed, and a model that ranked it first wrote "|end|>" into the field."""

from __future__ import annotations

import torch

import hf_paged
from hf_paged import programs as hp
from hf_paged.programs.connect import backend_for
from hf_paged.programs.healing import heal_prompt
from tests.processors.toy_tokenizers import byte_level_tokenizer
from tests.programs.conftest import wrapped_llama_over

TEXT = "Answer in XML: <"


@hp.program
def xml(s):
    s += TEXT + hp.gen("x", max_tokens=3, heal=True)


def test_the_healed_token_is_never_a_special_one():
    tok = byte_level_tokenizer()  # specials <eos> <pad> <|end|>; "<tool>" is an added token that is not special
    model = wrapped_llama_over(tok)
    prompt = tok(TEXT)["input_ids"]
    specials = [tok.convert_tokens_to_ids(t) for t in ("<|end|>", "<pad>", "<eos>")]
    healing = heal_prompt(backend_for(model, tok), prompt)
    assert healing is not None and healing.lead == "<"
    allowed = healing.processor.allowed.nonzero().flatten().tolist()
    assert not set(allowed) & set(specials) and tok.convert_tokens_to_ids("<tool>") in allowed
    # make the special tokens the model's first choices right where the healed token is chosen
    with torch.no_grad():
        hidden = model.model(torch.tensor([prompt[:-1]])).last_hidden_state[0, -1]
        for rank, token in enumerate(specials):
            model.lm_head.weight[token] = (60 - rank) * hidden / hidden.norm()
    state = xml.run(model, tok)
    (first,) = state.token_ids[len(prompt) - 1:][:1]
    assert first not in specials and tok.decode([first]).startswith("<")
    assert state.text == TEXT + state["x"] and not state["x"].startswith(("|end|>", "eos>", "pad>"))
    hf_paged.unwrap(model)
