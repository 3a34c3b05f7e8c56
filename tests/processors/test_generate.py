"""Stock `model.generate` with a tiny random GPT-2 over the toy vocabulary: every output is valid."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_paged.processors import ChoiceLogitsProcessor, JSONSchemaLogitsProcessor
from hf_paged.processors.automaton.grammar import Grammar
from tests.processors.toy_tokenizers import byte_level_tokenizer, sentencepiece_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,  # else a random model wanders into extra keys (valid, but rarely finishes)
}


def tiny_model(tok, vocab_size: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_layer=1,
        n_embd=16,
        n_head=2,
        n_positions=256,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("make_tok", [byte_level_tokenizer, sentencepiece_tokenizer])
def test_generations_parse_and_validate_across_calls(make_tok):
    tok = make_tok()
    model = tiny_model(tok, len(tok) + 9)  # padded embedding rows beyond the tokenizer
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    prompt = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    finished = 0
    for seed in range(2):  # the same processor, reused by two generate calls
        torch.manual_seed(seed)
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            logits_processor=[proc],
            max_new_tokens=60,
            do_sample=True,
            pad_token_id=tok.eos_token_id,
        )
        for row in out[:, prompt.shape[1] :].tolist():
            if tok.eos_token_id not in row:
                continue
            finished += 1
            text = tok.decode(row[: row.index(tok.eos_token_id)])
            jsonschema.validate(json.loads(text), SCHEMA)
    assert finished >= 4


def test_greedy_choice():
    tok = byte_level_tokenizer()
    model = tiny_model(tok, len(tok))
    proc = ChoiceLogitsProcessor(["yes", "no", "maybe"], tok)
    prompt = torch.tensor([[1, 2], [3, 4]])
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        logits_processor=[proc],
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=tok.eos_token_id,
    )
    texts = [tok.decode(row, skip_special_tokens=True) for row in out[:, 2:].tolist()]
    assert all(t in ("yes", "no", "maybe") for t in texts)


def test_pydantic_model_class():
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        y: bool

    proc = JSONSchemaLogitsProcessor(Point, byte_level_tokenizer())
    assert proc.schema["required"] == ["x", "y"]
    assert isinstance(proc.regex, Grammar)  # (undeclared keys after x and y: a free value, a rule)
    strict = JSONSchemaLogitsProcessor(Point, byte_level_tokenizer(), undeclared_keys=False)
    assert strict.regex.startswith(r"\{")


def test_grammar_schema_generations_parse_and_validate():
    # four levels of four optional members: over the flat regex budget, so written as a grammar of called rules
    node: dict = {"type": "string", "maxLength": 6}
    for level in range(4):
        node = {"type": "object", "properties": {f"k{level}{i}": node for i in range(4)}, "additionalProperties": False}
    tok = byte_level_tokenizer()
    model = tiny_model(tok, len(tok))
    proc = JSONSchemaLogitsProcessor(node, tok)
    assert isinstance(proc.regex, Grammar)
    prompt = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]])
    torch.manual_seed(0)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), logits_processor=[proc], max_new_tokens=80,
                         do_sample=True, pad_token_id=tok.eos_token_id)
    finished = 0
    for row in out[:, prompt.shape[1] :].tolist():
        if tok.eos_token_id in row:
            finished += 1
            jsonschema.validate(json.loads(tok.decode(row[: row.index(tok.eos_token_id)])), node)
    assert finished >= 2
