"""JSON-schema processors inside the engine: valid output, jump-forward exactness, failures stay local."""

import json

import jsonschema
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, RequestStatus, SamplingParams
from hf_paged.processors.automaton.grammar import Grammar
from tests.tiny_models import byte_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"count": {"type": "integer", "minimum": 0, "maximum": 99}, "kind": {"enum": ["cat", "dog"]}},
    "required": ["count", "kind"],
    "additionalProperties": False,
}


def model_and_tokenizer():
    tok = byte_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, eos_token_id=tok.eos_token_id,
                                         pad_token_id=tok.eos_token_id, bos_token_id=None)).eval()
    return model, tok


def stock_and_engine(model, tok, proc, prompts: list[list[int]], max_new_tokens: int):
    """Greedy outputs of stock `generate` (one prompt at a time) and of the engine (all at once, jump-forward on),
    both with `proc`; and the engine."""
    stock = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False,
                             logits_processor=[proc], eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        stock.append(out[0, len(p):].tolist())
    engine = Engine(model, PagedConfig(block_size=8))
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id, logits_processors=[proc])
    ids = [engine.add_request(p, params) for p in prompts]
    outs = engine.run(ids)
    return stock, [outs[i].generated_tokens for i in ids], engine


def test_engine_json_outputs_validate_and_jump_forward_is_exact():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    prompts = [tok(p)["input_ids"] for p in ("Pets: ", "Tell me about 3 cats as JSON:", "{")]
    stock, ours, engine = stock_and_engine(model, tok, proc, prompts, max_new_tokens=60)
    assert ours == stock  # forced tokens appended in one forward give exactly what decoding step by step gives
    for tokens in ours:
        doc = json.loads(tok.decode(tokens, skip_special_tokens=True))
        assert 0 <= doc["count"] <= 99 and doc["kind"] in ("cat", "dog")
    stats = engine.stats()
    assert stats["forced_tokens"] > 0  # jump-forward saved decode steps (keys, punctuation)
    assert stats["steps"] < sum(map(len, ours))


def _nested(levels: int) -> dict:
    node: dict = {"type": "string", "maxLength": 6}
    for level in range(levels):
        node = {"type": "object", "properties": {f"k{level}{i}": node for i in range(4)}, "additionalProperties": False}
    return node


def test_engine_with_a_grammar_schema_matches_stock_generate():
    # over the flat regex budget: compiled as a grammar of rules whose automaton is built while decoding
    model, tok = model_and_tokenizer()
    schema = _nested(4)
    proc = JSONSchemaLogitsProcessor(schema, tok)
    assert isinstance(proc.regex, Grammar)
    prompts = [tok(p)["input_ids"] for p in ("Config: ", "{")]
    stock, ours, _ = stock_and_engine(model, tok, proc, prompts, max_new_tokens=40)
    assert ours == stock
    for tokens in stock:
        if tok.eos_token_id in tokens:
            jsonschema.validate(json.loads(tok.decode(tokens, skip_special_tokens=True)), schema)


def test_a_failing_constraint_only_fails_its_request():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)

    class Broken(JSONSchemaLogitsProcessor):
        def process_rows(self, request_ids, generated, scores):
            raise RuntimeError("guide exploded")

    broken = Broken(SCHEMA, tok)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=64))
    good = engine.add_request(tok("a")["input_ids"], SamplingParams(max_new_tokens=40, eos_token_id=tok.eos_token_id,
                                                                     logits_processors=[proc]))
    bad = engine.add_request(tok("b")["input_ids"], SamplingParams(max_new_tokens=40, logits_processors=[broken]))
    outs = engine.run([good, bad])
    assert outs[good].status is RequestStatus.FINISHED
    json.loads(tok.decode(outs[good].generated_tokens, skip_special_tokens=True))
    assert outs[bad].status is RequestStatus.FAILED and "guide exploded" in outs[bad].error
    assert engine.cache.pool.num_free_blocks == 64


def test_max_new_tokens_cutting_a_document_short_is_reported():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    engine = Engine(model, PagedConfig(block_size=8))
    rid = engine.add_request(tok("x")["input_ids"], SamplingParams(max_new_tokens=5, eos_token_id=tok.eos_token_id,
                                                                    logits_processors=[proc]))
    out = engine.run([rid])[rid]
    assert out.finish_reason == "length_incomplete" and len(out.generated_tokens) == 5


def test_a_token_another_processor_bans_is_not_forced():
    """Jump-forward appended the constraint's one allowed token unchecked, so a token `bad_words_ids` or
    `suppress_tokens` bans entered the output, where stock's step masks it (h9). Beside other processors the engine
    decides each token in a step, as stock does."""
    from transformers import SuppressTokensLogitsProcessor

    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    quote = tok('"')["input_ids"][-1]
    ban = SuppressTokensLogitsProcessor([quote])
    prompt = tok("Pets: ")["input_ids"]
    stock = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, logits_processor=[proc, ban],
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)[0, len(prompt):].tolist()
    engine = Engine(model, PagedConfig(block_size=8))
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=12, eos_token_id=tok.eos_token_id,
                                                    logits_processors=[proc, ban]))
    out = engine.run([rid])[rid]
    assert quote not in out.generated_tokens and out.generated_tokens == stock[:len(out.generated_tokens)]
    assert engine.stats()["forced_tokens"] == 0
