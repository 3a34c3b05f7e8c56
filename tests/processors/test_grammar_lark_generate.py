"""`GrammarLogitsProcessor` in stock `generate` and in the engine: every finished output is a sentence Lark parses,
token-level walks reach every rule, and a grammar compiled twice is built once."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessor, LogitsProcessorList

import hf_paged
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.processors import GrammarLogitsProcessor, IndexCache
from hf_paged.processors.lark.syntax import parse_lark
from tests.processors.hostile_inputs import gpt2_or_toy
from tests.processors.lark_grammars import ARITHMETIC, GRAMMARS, PYTHONISH, SQL, Sentences, lark_parser, plain
from tests.processors.toy_tokenizers import byte_level_tokenizer

lark = pytest.importorskip("lark")


class EosBias(LogitsProcessor):
    """Raise EOS so that a random model ends some documents (applied before the grammar's mask)."""

    def __init__(self, eos: int, bias: float) -> None:
        self.eos, self.bias = eos, bias

    def __call__(self, input_ids, scores):
        scores[:, self.eos] += self.bias
        return scores


def tiny_gpt2(tok) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_layer=1, n_embd=16, n_head=2, n_positions=256,
                        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    return GPT2LMHeadModel(config).eval()


def finished_texts(tok, rows: list[list[int]]) -> list[str]:
    """The decoded outputs that ended with EOS (the others ran out of tokens)."""
    return [tok.decode(row[: row.index(tok.eos_token_id)]) for row in rows if tok.eos_token_id in row]


@pytest.mark.parametrize("name", ["arithmetic", "sql", "pythonish", "json"])
def test_sampled_outputs_parse_with_lark(name):
    tok = byte_level_tokenizer()
    model = tiny_gpt2(tok)
    proc = GrammarLogitsProcessor(GRAMMARS[name], tok)
    parser = lark_parser(GRAMMARS[name])
    prompt = torch.tensor([[5, 6, 7]] * 12)
    texts = []
    for seed in range(2):  # the same processor, reused by two generate calls
        torch.manual_seed(seed)
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, max_new_tokens=64,
                             logits_processor=LogitsProcessorList([EosBias(tok.eos_token_id, 4.0), proc]),
                             pad_token_id=tok.eos_token_id)
        texts += finished_texts(tok, out[:, prompt.shape[1]:].tolist())
    assert len(texts) >= 6
    for text in texts:
        parser.parse(text)  # raises on a text outside the grammar


def token_walks(proc: GrammarLogitsProcessor, tok, num_docs: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Documents drawn token by token among the tokens each state allows (a model that knows nothing but prefers
    punctuation and keywords' letters a little, so that documents also close their brackets); EOS, when allowed,
    ends the document with probability 1/4."""
    rng = random.Random(seed)
    compiled = proc.compiled
    eos = set(proc.vocab.eos_token_ids)
    weight = {t: 1.0 if tok.decode([t]).strip().isalnum() else 4.0 for t in range(len(tok))}
    docs = []
    for _ in range(num_docs):
        state, ids = compiled.index.get_initial_state(), []
        for _ in range(max_tokens):
            bits = np.unpackbits(compiled.mask(state).words.view(np.uint8), bitorder="little")
            allowed = [int(t) for t in np.flatnonzero(bits) if t not in eos]
            if compiled.index.is_final_state(state) and (not allowed or rng.random() < 0.25):
                docs.append(ids)
                break
            token = rng.choices(allowed, [weight.get(t, 1.0) for t in allowed])[0]
            ids.append(token)
            state = compiled.index.get_next_state(state, token)
    return docs


@pytest.mark.parametrize("name", ["arithmetic", "sql", "pythonish"])
def test_token_walks_parse_and_derived_sentences_reach_every_rule(name):
    grammar = GRAMMARS[name]
    parser = lark_parser(plain(grammar))
    tok = byte_level_tokenizer()
    proc = GrammarLogitsProcessor(grammar, tok)
    docs = token_walks(proc, tok, num_docs=200, max_tokens=200, seed=1)  # what the masks offer is in the grammar
    assert len(docs) >= 30
    for ids in docs:
        parser.parse(tok.decode(ids))
    # and every rule can be reached through the masks: sentences derived from the grammar, tokenized by GPT-2 (50k
    # tokens, when the shared data is there: tokens that cross terminals and ignored spaces), are allowed token by
    # token and may end exactly where they end (under Lark's own %ignore: the sentences write whitespace runs as Lark
    # allows them, which the default bound of one character between tokens refuses)
    gpt2 = gpt2_or_toy()
    proc = GrammarLogitsProcessor(grammar, gpt2, max_ignored=None)
    compiled = proc.compiled
    derived = Sentences(grammar, seed=3)
    reached: set[str] = set()
    for _ in range(40):
        text = derived.sentence()
        state = compiled.index.get_initial_state()
        for token in gpt2(text, add_special_tokens=False)["input_ids"]:
            words = compiled.mask(state).words.view(np.uint32)
            assert words[token >> 5] >> np.uint32(token & 31) & 1, (text, token)
            state = compiled.index.get_next_state(state, token)
        assert compiled.index.is_final_state(state), text
        reached |= {str(sub.data) for sub in parser.parse(text).iter_subtrees()}
    assert reached == set(parse_lark(grammar).rules)


def test_engine_requests_give_sentences_and_match_stock_generate():
    tok = byte_level_tokenizer()
    model = tiny_gpt2(tok)
    proc = GrammarLogitsProcessor(ARITHMETIC, tok)
    parser = lark_parser(ARITHMETIC)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    stock = []
    for p in prompts:  # greedy: the engine must give the very same tokens
        out = model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, logits_processor=[proc],
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        stock.append(out[0, len(p):].tolist())
    engine = Engine(model, PagedConfig(block_size=8))
    params = SamplingParams(max_new_tokens=24, eos_token_id=tok.eos_token_id, logits_processors=[proc])
    ids = [engine.add_request(p, params) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == stock
    sampled = []
    for seed in range(6):  # sampled requests, each its own seed, all at once
        params = SamplingParams(max_new_tokens=48, do_sample=True, seed=seed, eos_token_id=tok.eos_token_id,
                                logits_processors=[EosBias(tok.eos_token_id, 4.0), proc])
        sampled.append(engine.add_request(prompts[seed % 3], params))
    outs = engine.run(sampled)
    texts = finished_texts(tok, [outs[i].generated_tokens for i in sampled])
    assert texts
    for text in texts:
        parser.parse(text)
    engine.check_integrity()


def test_wrapped_generate_batch_with_the_processor():
    from transformers import GenerationConfig

    tok = byte_level_tokenizer()
    model = hf_paged.wrap(tiny_gpt2(tok), PagedConfig(block_size=8))
    try:
        proc = GrammarLogitsProcessor(SQL, tok)
        torch.manual_seed(0)
        config = GenerationConfig(max_new_tokens=64, do_sample=True, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.eos_token_id)
        outs = model.generate_batch([[5, 6, 7], [8, 9], [10], [11, 12]] * 2, config,
                                    logits_processor=[EosBias(tok.eos_token_id, 4.0), proc])
        texts = finished_texts(tok, [out.generated_tokens for out in outs.values()])
        assert texts
        parser = lark_parser(SQL)
        for text in texts:
            parser.parse(text)
    finally:
        hf_paged.unwrap(model)


def test_a_grammar_compiled_twice_is_built_once():
    tok = byte_level_tokenizer()
    cache = IndexCache(max_entries=4)
    first = GrammarLogitsProcessor(PYTHONISH, tok, index_cache=cache)
    assert cache.get(first.index_key) is None  # compiled on first use (or `prepare`), in the background
    compiled = first.compiled
    second = GrammarLogitsProcessor(PYTHONISH, tok, index_cache=cache)
    assert second.index_key == first.index_key and cache.get(second.index_key) is compiled
    assert second.compiled is compiled
    other = GrammarLogitsProcessor(PYTHONISH, tok, index_cache=cache, start="expr")
    assert other.index_key != first.index_key and other.compiled is not compiled


def test_processor_is_exported_and_checks_its_arguments():
    assert hf_paged.GrammarLogitsProcessor is GrammarLogitsProcessor
    assert GrammarLogitsProcessor.supports_continuous_batching
    with pytest.raises(TypeError, match="start"):
        GrammarLogitsProcessor(ARITHMETIC, byte_level_tokenizer(), start="")
