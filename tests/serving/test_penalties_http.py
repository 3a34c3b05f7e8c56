"""OpenAI's `presence_penalty`, `frequency_penalty` and `logit_bias`, and vLLM's `min_p`, over HTTP: greedy answers
are stock `generate`'s with the oracle processors of tests/batching/test_penalties.py, a bias never breaks a
constraint, min_p 1 samples the greedy text, bad values are 400s naming the field."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import LogitsProcessorList

from tests.batching.test_penalties import OpenAIBias, OpenAIPenalties
from tests.serving.test_errors import assert_error


def complete(server, **body):
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "def main():", "max_tokens": 24,
                                                         "temperature": 0, "return_token_ids": True, **body},
                   timeout=120)
    return r


def stock(tiny_lm, prompt_ids, *, presence=0.0, frequency=0.0, bias=None):
    model, _ = tiny_lm
    procs = ([OpenAIBias(bias)] if bias else []) + [OpenAIPenalties(len(prompt_ids), presence, frequency)]
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                         logits_processor=LogitsProcessorList(procs))
    return out[0, len(prompt_ids):].tolist()


def test_greedy_answers_are_stock_with_the_penalties_applied(server, tiny_lm):
    plain = complete(server, ignore_eos=True).json()["choices"][0]
    prompt_ids = plain["prompt_token_ids"]
    first = plain["token_ids"][0]
    cases = [{"frequency_penalty": 1.5}, {"presence_penalty": 2, "frequency_penalty": 0.5},
             {"logit_bias": {str(first): -100, "101": 4.5}, "presence_penalty": 0.5}]
    for case in cases:
        r = complete(server, ignore_eos=True, **case)
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["token_ids"]
        bias = {int(k): v for k, v in case.get("logit_bias", {}).items()} or None
        expected = stock(tiny_lm, prompt_ids, presence=case.get("presence_penalty", 0),
                         frequency=case.get("frequency_penalty", 0), bias=bias)
        assert got == expected and got != plain["token_ids"], case
    assert complete(server, ignore_eos=True, logit_bias={str(first): -100}).json()["choices"][0]["token_ids"][0] \
        != first  # -100 bans the token greedy would pick


def test_a_bias_never_lets_through_what_a_constraint_refuses(server, tiny_lm):
    _, tokenizer = tiny_lm
    choices = ["alpha", "beta"]
    outside = tokenizer("zzz", add_special_tokens=False)["input_ids"][0]
    for body in ({"temperature": 0}, {"temperature": 1.0, "seed": 3, "n": 4}):
        r = complete(server, guided_choice=choices, logit_bias={str(outside): 100}, frequency_penalty=-2, **body)
        assert r.status_code == 200, r.text
        assert all(c["text"] in choices for c in r.json()["choices"]), r.json()["choices"]


def test_min_p_of_one_samples_the_greedy_answer(server):
    greedy = complete(server, ignore_eos=True).json()["choices"][0]["token_ids"]
    r = complete(server, ignore_eos=True, temperature=1.5, min_p=1, n=3)
    assert r.status_code == 200, r.text
    assert [c["token_ids"] for c in r.json()["choices"]] == [greedy] * 3


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"min_p": 1.5}, "min_p", ["less than or equal to 1"]),
    ({"min_p": -0.5}, "min_p", ["greater than or equal to 0"]),
    ({"presence_penalty": 2.5}, "presence_penalty", ["less than or equal to 2"]),
    ({"frequency_penalty": -3}, "frequency_penalty", ["greater than or equal to -2"]),
    ({"frequency_penalty": "high"}, "frequency_penalty", []),
    ({"logit_bias": {"x": 1}}, "logit_bias", ["token ids as decimal strings", "'x'"]),
    ({"logit_bias": {"-5": 1}}, "logit_bias", ["token ids as decimal strings"]),
    ({"logit_bias": {"5": 101}}, "logit_bias", ["less than or equal to 100"]),
    ({"logit_bias": {"5": True}}, "logit_bias", []),
    ({"logit_bias": {"99999999999999999999": 1}}, "logit_bias", ["outside this model's vocabulary"]),
    ({"logit_bias": [5, 1]}, "logit_bias", []),
])
def test_bad_penalties_get_400_naming_the_field(server, body, param, words):
    assert_error(complete(server, **body), 400, param, words)
    chat = {"model": "tiny-lm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    assert_error(httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60), 400, param, words)
