"""The fields a program client needs: `return_token_ids` (vLLM's `prompt_token_ids` / `token_ids` on each choice,
our `finish_detail`), cached tokens in `usage`, and scoring through `echo: true, logprobs: 0, max_tokens: 0`
(with our `prompt_logprobs_start`), checked against the engine and a stock forward; bad combinations get 400s."""

from __future__ import annotations

import json

import pytest
import torch

from hf_paged.serving.logprobs import TokenPieces
from tests.serving.test_errors import assert_error, post
from tests.serving.test_openai_api import engine_greedy


def _complete(server, **body):
    response = post(server, "/v1/completions", {"model": "tiny-lm", **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_return_token_ids_match_the_engine(server, engine, tiny_lm):
    tokenizer = tiny_lm.tokenizer
    ids = tokenizer("def add(a, b):\n    ")["input_ids"]
    reference = engine_greedy(engine, ids, 12)
    out = _complete(server, prompt=ids, max_tokens=12, temperature=0, return_token_ids=True)
    (choice,) = out["choices"]
    assert choice["prompt_token_ids"] == ids
    assert choice["token_ids"] == reference.generated_tokens
    assert choice["finish_detail"] == reference.finish_reason
    assert choice["text"] == tokenizer.decode(reference.generated_tokens, skip_special_tokens=True)
    plain = _complete(server, prompt=ids, max_tokens=12, temperature=0)
    assert "token_ids" not in plain["choices"][0] and plain["choices"][0]["text"] == choice["text"]


def test_streamed_token_ids_add_up_to_the_whole(server, tiny_lm):
    ids = tiny_lm.tokenizer("for i in range(10):\n")["input_ids"]
    whole = _complete(server, prompt=ids, max_tokens=10, temperature=0, return_token_ids=True)["choices"][0]
    response = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 10, "temperature": 0,
                                                "return_token_ids": True, "stream": True})
    chunks = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: {")]
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == whole["token_ids"]
    assert chunks[-1]["choices"][0]["prompt_token_ids"] == ids
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]


def test_chat_choices_carry_token_ids_too(server, engine, tiny_lm):
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6, "temperature": 0,
            "return_token_ids": True}
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    reference = engine_greedy(engine, choice["prompt_token_ids"], 6)
    assert choice["token_ids"] == reference.generated_tokens
    assert choice["message"]["content"] == tiny_lm.tokenizer.decode(reference.generated_tokens,
                                                                   skip_special_tokens=True)


def test_a_guided_output_cut_short_says_so(server):
    out = _complete(server, prompt="Code: ", max_tokens=3, temperature=0, guided_regex="[a-z]{12}",
                    return_token_ids=True)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length" and choice["finish_detail"] == "length_incomplete"
    assert len(choice["token_ids"]) == 3


def _stock_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [None] + [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]


def test_echo_scores_every_prompt_token_like_a_stock_forward(server, tiny_lm):
    model, tokenizer = tiny_lm
    prompt = "# echo test\nimport math\nprint(math.pi)\n"
    ids = tokenizer(prompt)["input_ids"]
    out = _complete(server, prompt=prompt, echo=True, logprobs=0, max_tokens=0, return_token_ids=True)
    (choice,) = out["choices"]
    assert choice["prompt_token_ids"] == ids and choice["token_ids"] == []
    got = choice["logprobs"]["token_logprobs"]
    want = _stock_logprobs(model, ids)
    assert got[0] is None and len(got) == len(ids)
    assert max(abs(a - b) for a, b in zip(got[1:], want[1:])) < 1e-4
    assert choice["logprobs"]["tokens"] == [TokenPieces(tokenizer).label(t) for t in ids]
    assert choice["logprobs"]["top_logprobs"] is None and choice["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == len(ids) and out["usage"]["completion_tokens"] == 0


def test_echo_from_a_start_position_reuses_the_cached_prefix(server, tiny_lm):
    model, tokenizer = tiny_lm
    prefix = tokenizer("# scoring after a shared prefix\n" + "x = [1, 2, 3]\n" * 6)["input_ids"]
    choices = [tokenizer(" yes", add_special_tokens=False)["input_ids"],
               tokenizer(" no thanks", add_special_tokens=False)["input_ids"]]
    full = _complete(server, prompt=prefix + choices[0], echo=True, logprobs=0, max_tokens=0)
    out = _complete(server, prompt=[prefix + c for c in choices], echo=True, logprobs=0, max_tokens=0,
                    prompt_logprobs_start=len(prefix))
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= 2 * (len(prefix) // 16) * 16
    for choice, ids in zip(out["choices"], choices):
        got = choice["logprobs"]["token_logprobs"]
        assert got[: len(prefix)] == [None] * len(prefix) and len(got) == len(prefix) + len(ids)
        want = _stock_logprobs(model, prefix + ids)[len(prefix):]
        assert max(abs(a - b) for a, b in zip(got[len(prefix):], want)) < 1e-4
    whole = full["choices"][0]["logprobs"]["token_logprobs"][len(prefix):]
    assert max(abs(a - b) for a, b in zip(out["choices"][0]["logprobs"]["token_logprobs"][len(prefix):],
                                          whole)) < 1e-5
    # scored again with the prefix cached: positions to score are computed, never taken from the cache
    again = _complete(server, prompt=prefix + choices[0], echo=True, logprobs=0, max_tokens=0)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert max(abs(a - b) for a, b in zip(again["choices"][0]["logprobs"]["token_logprobs"][1:],
                                          full["choices"][0]["logprobs"]["token_logprobs"][1:])) < 1e-5


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"echo": True, "max_tokens": 0}, "logprobs", ["logprobs: 0"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 21}, "logprobs", ["from 0 to 20"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "stream": True}, "stream", ["echo scoring"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "n": 2}, "n", ["echo scoring"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "guided_regex": "a"}, "guided_regex", ["echo scoring"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "stop": "\n"}, "stop", ["echo scoring"]),
        ({"max_tokens": 4, "prompt_logprobs_start": 2}, "prompt_logprobs_start", ["echo: true"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "prompt_logprobs_start": 0}, "prompt_logprobs_start", []),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "prompt_logprobs_start": 50}, "prompt_logprobs_start",
         ["past the prompt"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "prompt": [5]}, "prompt", ["at least 2 tokens"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "prompt": [5, 10**6]}, "prompt", ["outside the vocabulary"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "prompt": [10**6, 5]}, "prompt", ["outside the vocabulary"]),
        ({"echo": True, "max_tokens": 0, "logprobs": 0, "prompt": [5] * 3000}, "prompt", ["maximum"]),
        ({"return_token_ids": "yes"}, "return_token_ids", []),
    ],
)
def test_bad_scoring_requests_get_400(server, body, param, words):
    assert_error(post(server, "/v1/completions", {"prompt": "hello there", **body}), 400, param, words)


def test_tokenize_gives_the_servers_ids(server, tiny_lm):
    tokenizer = tiny_lm.tokenizer
    response = post(server, "/tokenize", {"model": "tiny-lm", "prompt": "héllo {\"a\": 1}"})
    assert response.status_code == 200, response.text
    ids = tokenizer("héllo {\"a\": 1}")["input_ids"]
    assert response.json() == {"count": len(ids), "max_model_len": 2048, "tokens": ids}
    bare = post(server, "/tokenize", {"prompt": "hi", "add_special_tokens": False}).json()["tokens"]
    assert bare == tokenizer("hi", add_special_tokens=False)["input_ids"]
    assert_error(post(server, "/tokenize", {"model": "nope", "prompt": "hi"}), 404, "model")
    assert_error(post(server, "/tokenize", {"text": "hi"}), 400)
    # a text longer than any of max_model_len tokens can be: refused untokenized (10 MB took 17 s and 640 MB)
    huge = "x" * (server.app.state.server.preparer._max_chars + 1)
    assert_error(post(server, "/tokenize", {"prompt": huge}), 400, "prompt")


def test_models_report_the_block_size(server):
    import httpx

    (entry,) = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
    assert entry["block_size"] == 16
