"""Regression cases where the engine's processed distribution parted from stock `generate`'s (h101's sampling
comparison): each builds the case it was found on and checks the tokens and scores against stock."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning

VOCAB = 61  # not a multiple of 8


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                         eos_token_id=2)
    stock = LlamaForCausalLM(config).eval()
    return stock, hf_paged.wrap(copy.deepcopy(stock))


def _on_engine(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PagedFallbackWarning)
        return model.generate(*args, **kwargs)


@pytest.mark.parametrize("min_new_tokens", [0, 2])
def test_min_new_tokens_takes_precedence_over_min_length(models, min_new_tokens):
    """Stock's `_prepare_generated_length` sets min_length = prompt length + min_new_tokens whenever min_new_tokens
    is set (0 too): a larger min_length in the same config holds EOS back no longer. The engine kept the config's
    min_length, so EOS stayed masked up to it (other tokens, other scores)."""
    stock, wrapped = models
    ids = torch.tensor([[5, 17, 33, 8]])
    free = stock.generate(ids, max_new_tokens=7, do_sample=False, eos_token_id=None)[0, 4:].tolist()
    # the first greedy token from min_new_tokens on that did not come before becomes EOS: stock ends there, before
    # the config's min_length (12: 8 new tokens)
    at = next(i for i in range(min_new_tokens, len(free)) if free[i] not in free[:i])
    eos = free[at]
    kwargs = {"max_new_tokens": 8, "do_sample": False, "eos_token_id": eos, "min_new_tokens": min_new_tokens,
              "min_length": 12, "output_scores": True, "return_dict_in_generate": True}
    expected = stock.generate(ids, **kwargs)
    got = _on_engine(wrapped, ids, **kwargs)
    assert expected.sequences[0, -1] == eos and expected.sequences.shape[1] == 4 + at + 1
    assert got.sequences.tolist() == expected.sequences.tolist()
    for a, b in zip(got.scores, expected.scores):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("fields", [{"repetition_penalty": 1.3}, {"do_sample": True, "min_p": 0.1},
                                    {"no_repeat_ngram_size": 2, "bad_words_ids": [[5]]}, {"suppress_tokens": [4]}])
def test_sampling_params_from_a_generation_config_refuses_fields_it_would_drop(fields):
    """SamplingParams.from_generation_config read temperature/top-k/top-p and silently dropped every field stock
    turns into a logits processor (a checkpoint's repetition_penalty, min_p, ...): an Engine request built from it
    sampled from another distribution than stock. Now refused, naming the fields; generate/generate_batch pass
    stock's processors themselves (stock_processors=True)."""
    from transformers import GenerationConfig

    from hf_paged import SamplingParams
    from hf_paged.errors import InvalidConfigError

    config = GenerationConfig(**fields)
    with pytest.raises(InvalidConfigError, match=min(k for k in fields if k != "do_sample")):
        SamplingParams.from_generation_config(config)
    assert SamplingParams.from_generation_config(config, stock_processors=True).max_new_tokens >= 1
    # greedy ignores the warpers, as stock does; neutral values are not fields set
    SamplingParams.from_generation_config(GenerationConfig(min_p=0.1, repetition_penalty=1.0, typical_p=1.0))


@pytest.mark.parametrize("seed", [None, 3])
def test_min_new_tokens_masks_eos_before_the_request_s_own_processors(seed):
    """Stock's list holds its built-in MinNewTokensLengthLogitsProcessor before the caller's processors. The sampler
    masked EOS after a SamplingParams' logits_processors: a caller's TopKLogitsWarper(2) with EOS most likely kept EOS
    and one token, then EOS went, leaving one token to draw where stock keeps two (the drawn-together path, seed
    None; the row path, seeded; speculative verification's `process` alike)."""
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor, TopKLogitsWarper

    from hf_paged import SamplingParams
    from hf_paged.batching.request import Request
    from hf_paged.batching.sampler import Sampler

    logits = torch.tensor([[3.0, 2.0, 1.0, 0.5, -1.0, 0.0]])  # EOS (0) most likely
    prompt = [1, 2, 3]
    stock = MinNewTokensLengthLogitsProcessor(len(prompt), 1, torch.tensor([0]))(torch.tensor([prompt]), logits.clone())
    stock = TopKLogitsWarper(2)(torch.tensor([prompt]), stock)
    params = SamplingParams(do_sample=True, seed=seed, eos_token_id=0, min_new_tokens=1, output_scores=True,
                            logits_processors=[TopKLogitsWarper(2)])
    request = Request("r", prompt, params)
    result = Sampler()([request], logits.clone())
    assert result.errors == [None] and result.token_ids[0] in (1, 2)
    torch.testing.assert_close(request.scores[0], stock[0])
    processed = Sampler().process([Request("s", prompt, params)], logits.clone(), [[]])
    torch.testing.assert_close(processed.rows[0][0], stock[0])


def _stops_at(text: str, stop: str, min_new_tokens: int) -> int | None:
    """The number of tokens (bytes of `text`) after which check_stop first says "stop" (None: never)."""
    from hf_paged import SamplingParams
    from hf_paged.batching.request import Request
    from hf_paged.batching.stopping import check_stop
    from tests.tiny_models import byte_tokenizer

    tok = byte_tokenizer()
    params = SamplingParams(max_new_tokens=100, stop_strings=[stop], tokenizer=tok, min_new_tokens=min_new_tokens)
    request = Request("r", [1, 2], params)
    for token in tok(text, add_special_tokens=False)["input_ids"]:  # one token a byte
        request.output_ids.append(token)
        if check_stop(request, 10_000) is not None:
            return len(request.output_ids)
    return None


def test_no_stop_string_ends_within_min_new_tokens_as_vllm_min_tokens():
    """vLLM's min_tokens (the server's `min_tokens`, SamplingParams.min_new_tokens): neither EOS nor a stop string
    ends the output within its first min_tokens tokens (vLLM's detokenizer checks stop strings only past them,
    tests/detokenizer/test_min_tokens.py there: min_tokens=5, stop "e" -> " is Lee, and I'm a stud"). The engine
    stopped at the first "e" whatever min_new_tokens said. A match that only ends past them counts."""
    assert _stops_at("xeyyeab", "e", 0) == 2
    assert _stops_at("xeyyeab", "e", 3) == 5
    # an occurrence inside the first tokens is not seen later either; one that ends past them is
    assert _stops_at("xeyyab", "e", 3) is None
    assert _stops_at("abcdef", "cd", 3) == 4


def test_the_server_text_keeps_a_stop_sequence_within_min_tokens():
    """The server's TextStream cut the text at a stop sequence inside the first min_tokens tokens (and the engine
    ended there); vLLM shows it and stops at the first one ending past them. Pushed one token at a time or in one
    chunk across the bound (speculative decoding emits several tokens at once)."""
    from hf_paged.serving.text import TextStream
    from tests.tiny_models import byte_tokenizer

    tok = byte_tokenizer()
    ids = tok("xeyyeab", add_special_tokens=False)["input_ids"]
    one = TextStream(tok, ["e"], min_tokens=3)
    shown = "".join(one.push([t]) for t in ids) + one.finish()
    assert shown == "xeyy" and one.stopped
    chunk = TextStream(tok, ["e"], min_tokens=3)
    assert chunk.push(ids) + chunk.finish() == "xeyy"
    plain = TextStream(tok, ["e"])
    assert plain.push(ids) + plain.finish() == "x"


@pytest.mark.parametrize("field, value", [("top_p", "0.5"), ("top_p", None), ("top_p", True), ("top_k", True),
                                          ("do_sample", "yes"), ("do_sample", None), ("num_return_sequences", True)])
def test_sampling_params_refuse_values_that_were_read_as_something_else(field, value):
    """top_p of a string or None raised a bare TypeError ('<=' not supported) naming no field; top_k=True ran as
    top_k=1, top_p=True as 1.0, do_sample="yes" sampled and None ran greedy, num_return_sequences=True as 1. Each is
    an InvalidConfigError naming the field now; numpy's numbers still pass."""
    import numpy as np

    from hf_paged import SamplingParams
    from hf_paged.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})
    assert SamplingParams(top_k=np.int64(3), top_p=np.float32(0.5)).top_k == 3


class _NoFiniteScores:
    """A processor that leaves nothing to sample (every score -inf)."""

    def __call__(self, input_ids, scores):
        scores[:] = float("-inf")
        return scores


@pytest.mark.parametrize("seed", [None, 7])
def test_verifying_drafts_against_a_row_that_is_not_a_distribution_fails_the_request_alone(seed):
    """Decoding one token at a time fails such a request with SamplingError. Speculative verification drew anyway:
    unseeded, torch.multinomial raised a RuntimeError out of Engine.step (every request of the engine with it);
    seeded, the race's argmax over NaN emitted token 0 as if sampled (h101)."""
    from hf_paged import SamplingParams
    from hf_paged.batching.request import Request
    from hf_paged.batching.sampler import Sampler
    from hf_paged.batching.speculative import DraftRows, verify
    from hf_paged.errors import SamplingError

    request = Request("r", [1, 2, 3], SamplingParams(do_sample=True, seed=seed, num_speculative_tokens=2,
                                                     logits_processors=[_NoFiniteScores()]))
    request.draft_ids = [2, 4]
    (verdict,) = verify(DraftRows([request], torch.randn(3, 6), [0], [2]), Sampler())
    assert verdict.token_ids == [] and verdict.error is not None and verdict.error.error_type is SamplingError
