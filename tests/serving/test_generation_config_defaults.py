"""`--generation-config`: a request that omits a sampling field gets the checkpoint's generation_config value (auto,
as vLLM), OpenAI's default (vllm), or another directory's; a field the request sends always wins."""

from __future__ import annotations

import argparse
import copy

import httpx
import pytest
import torch
from transformers import GenerationConfig

from hf_paged import Engine, PagedConfig
from hf_paged.errors import CliError
from hf_paged.serving import ServerSettings, build_app
from hf_paged.serving.defaults import RequestDefaults, request_defaults
from hf_paged.serving.prepare import Preparer
from hf_paged.serving.protocol import ChatCompletionRequest, CompletionRequest
from hf_paged.serving.server import add_serve_arguments, check_generation_config
from tests.serving.conftest import ServerThread

# Qwen2.5-style sampling defaults (with a penalty strong enough to change the tiny model's greedy text), and the
# GPT-2-era max_length=20 that counts the prompt
SHIPPED = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.8,
           "max_length": 20}


@pytest.fixture(scope="module")
def shipped(tiny_lm):
    """The embedded model with a checkpoint's generation_config (a copy: the session's model stays as it is)."""
    model, tokenizer = tiny_lm
    model = copy.deepcopy(model)
    model.generation_config = GenerationConfig(**{**model.generation_config.to_diff_dict(), **SHIPPED})
    return model, tokenizer


def _preparer(model, tokenizer, mode="auto"):
    engine = Engine(model, PagedConfig(block_size=16, num_blocks=64))
    return Preparer(engine, tokenizer, defaults=request_defaults(model, mode))


def test_omitted_fields_take_the_checkpoints_values(shipped):
    model, tokenizer = shipped
    preparer = _preparer(model, tokenizer)
    params = preparer.completion(CompletionRequest(prompt="def main():")).params
    assert (params.do_sample, params.temperature, params.top_p, params.top_k, params.min_p) == \
        (True, 0.6, 0.9, 20, 0.05)
    assert [type(p).__name__ for p in params.logits_processors] == ["RepetitionPenaltyLogitsProcessor"]
    assert params.logits_processors[0].penalty == 1.8
    assert params.max_new_tokens == 16  # max_length=20 is not read (it would count the prompt); OpenAI's 16
    # a field the request sends wins; temperature 0 is greedy, top_k -1 and repetition_penalty 1 turn them off
    sent = preparer.completion(CompletionRequest(prompt="def main():", temperature=0, top_p=1, top_k=-1, min_p=0,
                                                 repetition_penalty=1, max_tokens=5)).params
    assert (sent.do_sample, sent.top_p, sent.top_k, sent.min_p, sent.logits_processors, sent.max_new_tokens) == \
        (False, 1.0, None, 0.0, [], 5)
    assert preparer.completion(CompletionRequest(prompt="x", temperature=1.1)).params.temperature == 1.1


def test_vllm_mode_ignores_the_checkpoint(shipped):
    model, tokenizer = shipped
    params = _preparer(model, tokenizer, "vllm").completion(CompletionRequest(prompt="def main():")).params
    assert (params.do_sample, params.temperature, params.top_p, params.top_k, params.logits_processors) == \
        (True, 1.0, 1.0, None, [])


def test_max_new_tokens_is_the_default_max_tokens(tiny_lm):
    model, tokenizer = tiny_lm
    model = copy.deepcopy(model)
    model.generation_config.max_new_tokens = 7
    preparer = _preparer(model, tokenizer)
    assert preparer.completion(CompletionRequest(prompt="a")).params.max_new_tokens == 7
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    assert preparer.chat(chat).params.max_new_tokens == 7
    model.generation_config.max_new_tokens = 10**6  # chat: never past the room the prompt leaves
    preparer = _preparer(model, tokenizer)
    engine = preparer.engine  # the room: the model's positions and the whole pool (64 blocks of 16 here)
    positions = min(engine.max_model_len, engine.cache.num_blocks * engine.config.block_size)
    room = positions - len(preparer.chat(chat).prompts[0])
    assert preparer.chat(chat).params.max_new_tokens == room
    assert _preparer(model, tokenizer, "vllm").completion(CompletionRequest(prompt="a")).params.max_new_tokens == 16


def test_a_directory_gives_the_defaults(tmp_path, tiny_lm):
    GenerationConfig(temperature=0.3, top_k=5, do_sample=True).save_pretrained(tmp_path)
    assert request_defaults(tiny_lm[0], str(tmp_path)) == RequestDefaults(temperature=0.3, top_k=5)
    with pytest.raises(ValueError, match="generation_config.json"):
        request_defaults(tiny_lm[0], str(tmp_path / "nowhere"))


def test_greedy_answers_equal_stock_generate_under_the_checkpoints_config(shipped):
    """temperature 0 with the checkpoint's repetition_penalty: stock `generate(do_sample=False)` applies the
    config's penalty too, so the server's tokens are stock's (and not the unpenalised ones)."""
    model, tokenizer = shipped
    prompt = tokenizer("def main():\n    for i in range(10):\n")["input_ids"]
    ids = torch.tensor([prompt])

    def stock(**kwargs):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24, **kwargs)
        return out[0, len(prompt):].tolist()

    penalised, plain = stock(), stock(repetition_penalty=1.0)
    assert penalised != plain  # the penalty matters here, so the comparison below can fail
    for mode, expected in (("auto", penalised), ("vllm", plain)):
        engine = Engine(model, PagedConfig(block_size=16, num_blocks=64))
        with ServerThread(build_app(engine, tokenizer, ServerSettings(model_name="m", generation_config=mode))) as s:
            answer = httpx.post(s.url + "/v1/completions", json={"prompt": prompt, "temperature": 0, "max_tokens": 24,
                                                                 "return_token_ids": True}, timeout=120).json()
        assert answer["choices"][0]["token_ids"] == expected, mode


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flag(tmp_path):
    assert _args().generation_config == "auto"
    check_generation_config(_args("--generation-config", "vllm"))
    with pytest.raises(CliError, match="--generation-config 'greedy'"):
        check_generation_config(_args("--generation-config", "greedy"))
    GenerationConfig(temperature=0.3, do_sample=True).save_pretrained(tmp_path)
    check_generation_config(_args("--generation-config", str(tmp_path)))
