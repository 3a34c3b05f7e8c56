"""Log-probabilities over HTTP: completions' `logprobs: N`, chat's `logprobs: true` + `top_logprobs: N`, streamed or
not, with `n`, stop sequences, a JSON schema, and `echo: true` with generation (lm-evaluation-harness's
`local-completions` loglikelihood form); every value checked against a stock forward's log_softmax (fp32)."""

from __future__ import annotations

import json

import pytest
import torch

from hf_paged.serving.logprobs import TokenPieces
from tests.serving.test_errors import assert_error, post

# fp32 logprobs through the engine's kernels vs a stock forward: other summation orders (and, in a fresh checkout,
# the torch path until the numba kernels are compiled) differ by ~1e-5 on the embedded model; issue 44's tolerance
ATOL = 1e-4


def reference(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Row j: log_softmax of a stock forward's logits before token j of prompt + generated (j >= 1)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    return torch.cat([torch.full((1, logits.shape[-1]), float("nan")), torch.log_softmax(logits, dim=-1)[:-1]])


def ok(server, path, body) -> dict:
    response = post(server, path, {"model": "tiny-lm", **body})
    assert response.status_code == 200, response.text
    return response.json()


def streamed(server, path, body) -> list[dict]:
    response = post(server, path, {"model": "tiny-lm", **body, "stream": True})
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


def check_completion(model, tokenizer, prompt, choice, k: int) -> None:
    """A completions choice's `logprobs` against the reference: its entries cover its tokens, top k + chosen."""
    lp, tokens = choice["logprobs"], choice["token_ids"]
    label = TokenPieces(tokenizer).label  # a piece of a character is "bytes:\\xe6"
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    ref = reference(model, prompt, tokens)[len(prompt):]
    for j, (piece, value, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])):
        assert piece == label(tokens[j])
        assert abs(value - float(ref[j, tokens[j]])) < ATOL
        best = torch.topk(ref[j], k)
        want = {label(t): float(v) for t, v in zip(best.indices.tolist(), best.values.tolist())}
        assert set(top) == set(want) | {piece} and top[piece] == value
        assert all(abs(top[text] - v) < ATOL for text, v in want.items())


def test_completion_logprobs_match_a_stock_forward(server, tiny_lm):
    model, tokenizer = tiny_lm
    prompt = tokenizer("def add(a, b):\n    ")["input_ids"]
    out = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 3,
                                         "return_token_ids": True})
    (choice,) = out["choices"]
    assert len(choice["token_ids"]) == 10
    check_completion(model, tokenizer, prompt, choice, 3)
    offsets = choice["logprobs"]["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] < len(choice["text"])
    plain = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0})
    assert plain["choices"][0]["logprobs"] is None and plain["choices"][0]["text"] == choice["text"]


def test_streamed_entries_are_the_same_as_the_whole(server, tiny_lm):
    prompt = tiny_lm.tokenizer("Once upon a time")["input_ids"]
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 2}
    whole = ok(server, "/v1/completions", body)["choices"][0]["logprobs"]
    chunks = [c["choices"][0]["logprobs"] for c in streamed(server, "/v1/completions", body) if c["choices"]]
    joined = {key: [x for c in chunks if c for x in c[key]] for key in whole}
    assert joined["tokens"] == whole["tokens"] and joined["text_offset"] == whole["text_offset"]
    # the same values up to the last bits (the second request's prompt comes from the prefix cache: other kernels)
    assert joined["token_logprobs"] == pytest.approx(whole["token_logprobs"], abs=ATOL)
    assert [sorted(t) for t in joined["top_logprobs"]] == [sorted(t) for t in whole["top_logprobs"]]
    assert sum(1 for c in chunks if c and c["tokens"]) > 1  # really spread over chunks

    chat = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 2}
    content = ok(server, "/v1/chat/completions", chat)["choices"][0]["logprobs"]["content"]
    chunks = streamed(server, "/v1/chat/completions", chat)
    items = [x for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
             for x in c["choices"][0]["logprobs"]["content"]]
    assert [(x["token"], x["bytes"], [t["token"] for t in x["top_logprobs"]]) for x in items] == \
        [(x["token"], x["bytes"], [t["token"] for t in x["top_logprobs"]]) for x in content]
    assert [x["logprob"] for x in items] == pytest.approx([x["logprob"] for x in content], abs=ATOL)


def test_chat_logprobs_have_tokens_bytes_and_top_alternatives(server, tiny_lm):
    model, tokenizer = tiny_lm
    body = {"messages": [{"role": "user", "content": "Write a loop"}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 3, "return_token_ids": True}
    (choice,) = ok(server, "/v1/chat/completions", body)["choices"]
    tokens, content = choice["token_ids"], choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [tokenizer.decode([t]) for t in tokens]
    ref = reference(model, choice["prompt_token_ids"], tokens)[len(choice["prompt_token_ids"]):]
    for j, item in enumerate(content):
        assert abs(item["logprob"] - float(ref[j, tokens[j]])) < ATOL
        assert bytes(item["bytes"]).decode("utf-8", errors="replace") == item["token"] or item["token"] == "\ufffd"
        assert [t["logprob"] for t in item["top_logprobs"]] == pytest.approx(torch.topk(ref[j], 3).values.tolist(),
                                                                             abs=ATOL)
    only = ok(server, "/v1/chat/completions", {**body, "top_logprobs": None})["choices"][0]["logprobs"]["content"]
    assert [c["logprob"] for c in only] == pytest.approx([c["logprob"] for c in content], abs=ATOL)
    assert all(c["top_logprobs"] == [] for c in only)
    off = ok(server, "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None})
    assert off["choices"][0]["logprobs"] is None


def test_each_choice_of_n_has_its_own_entries(server, tiny_lm):
    model, tokenizer = tiny_lm
    prompt = tokenizer("class ")["input_ids"]
    out = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "n": 2, "temperature": 0.9, "seed": 3,
                                         "logprobs": 1, "return_token_ids": True})
    first, second = out["choices"]
    assert first["token_ids"] != second["token_ids"]
    for choice in (first, second):
        check_completion(model, tokenizer, prompt, choice, 1)


def test_entries_end_where_a_stop_sequence_cuts_the_text(server, tiny_lm):
    prompt = tiny_lm.tokenizer("The quick brown fox")["input_ids"]
    body = {"prompt": prompt, "max_tokens": 30, "temperature": 0, "logprobs": 0}
    free = ok(server, "/v1/completions", body)["choices"][0]
    text = free["text"]
    cut_at = next(i for i in range(len(text) // 2, 0, -1) if text.find(text[i : i + 3]) == i)  # its first place
    stop = text[cut_at : cut_at + 3]
    for chunks in (None, "stream"):
        if chunks is None:
            cut = ok(server, "/v1/completions", {**body, "stop": [stop], "return_token_ids": True})["choices"][0]
            lp, shown = cut["logprobs"], cut["text"]
            assert len(cut["token_ids"]) > len(lp["tokens"])  # the tokens that spell the stop: no entries
        else:
            parts = [c["choices"][0] for c in streamed(server, "/v1/completions", {**body, "stop": [stop]})
                     if c["choices"]]
            shown = "".join(p["text"] for p in parts)
            lp = {k: [x for p in parts if p["logprobs"] for x in p["logprobs"][k]] for k in ("tokens", "text_offset")}
        assert shown == text[: text.index(stop)]
        n = len(lp["tokens"])
        assert lp["tokens"] == free["logprobs"]["tokens"][:n]
        assert "".join(lp["tokens"]).startswith(shown) and all(o < len(shown) for o in lp["text_offset"])
        assert len("".join(lp["tokens"][:-1])) < len(shown)  # no entry past the one that reaches the cut


def test_a_json_schema_choice_reports_raw_logprobs(server, tiny_lm):
    model, tokenizer = tiny_lm
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    prompt = tokenizer("JSON: ")["input_ids"]
    out = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 2,
                                         "guided_json": schema, "return_token_ids": True})
    (choice,) = out["choices"]
    check_completion(model, tokenizer, prompt, choice, 2)
    assert choice["text"].startswith("{")


def test_echo_with_generation_is_lm_eval_loglikelihood(server, tiny_lm):
    """lm-evaluation-harness's local-completions: token prompts, `echo: true, max_tokens: 1, logprobs: 1,
    temperature: 0`; it reads token_logprobs[ctxlen:-1] and compares each with max(top_logprobs) for is_greedy."""
    model, tokenizer = tiny_lm
    context = tokenizer("The capital of France is")["input_ids"]
    continuations = [tokenizer(" Paris", add_special_tokens=False)["input_ids"],
                     tokenizer(" a city", add_special_tokens=False)["input_ids"]]
    with torch.no_grad():  # make one continuation the greedy one
        greedy = int(model(torch.tensor([context])).logits[0, -1].argmax())
    continuations.append([greedy])
    prompts = [context + c for c in continuations]
    out = ok(server, "/v1/completions", {"prompt": prompts, "echo": True, "max_tokens": 1, "logprobs": 1,
                                         "temperature": 0, "seed": 1234})
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert len(choices) == 3
    for prompt, choice in zip(prompts, choices):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt) + 1 and lp["token_logprobs"][0] is None
        assert lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0
        assert choice["text"].startswith(tokenizer.decode(prompt, skip_special_tokens=False))
        ref = reference(model, prompt, [])
        for j in range(1, len(prompt)):
            assert abs(lp["token_logprobs"][j] - float(ref[j, prompt[j]])) < ATOL
        ctxlen = len(context)
        values, tops = lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1]
        is_greedy = all(v == max(top.values()) for v, top in zip(values, tops))
        assert is_greedy == all(int(ref[j].argmax()) == prompt[j] for j in range(ctxlen, len(prompt)))
    assert [c["logprobs"]["token_logprobs"][-2] for c in choices][2] == max(choices[2]["logprobs"]["top_logprobs"][-2]
                                                                            .values())
    plain = ok(server, "/v1/completions", {"prompt": prompts[0], "echo": True, "max_tokens": 3, "temperature": 0})
    assert plain["choices"][0]["logprobs"] is None
    assert plain["choices"][0]["text"].startswith(tokenizer.decode(prompts[0], skip_special_tokens=False))
    forks = ok(server, "/v1/completions", {"prompt": prompts[:2], "echo": True, "max_tokens": 4, "logprobs": 0,
                                           "n": 2, "temperature": 0.8, "seed": 5, "return_token_ids": True})
    for choice in forks["choices"]:  # choice i * n + k: prompt i's entries, then fork k's own
        prompt, lp = prompts[choice["index"] // 2], choice["logprobs"]
        assert len(lp["tokens"]) == len(prompt) + len(choice["token_ids"])
        assert lp["token_logprobs"][: len(prompt)] == pytest.approx(choices[choice["index"] // 2]["logprobs"]
                                                                    ["token_logprobs"][: len(prompt)], abs=ATOL)
        tail = reference(model, prompt, choice["token_ids"])[len(prompt):]
        assert lp["token_logprobs"][len(prompt):] == pytest.approx(
            [float(tail[j, t]) for j, t in enumerate(choice["token_ids"])], abs=ATOL)
        assert lp["text_offset"] == sorted(lp["text_offset"]) and choice["text"].startswith(
            tokenizer.decode(prompt, skip_special_tokens=False))


def test_streamed_echo_starts_each_choice_with_its_prompt(server, tiny_lm):
    tokenizer = tiny_lm.tokenizer
    prompts = [tokenizer("Once upon a time")["input_ids"], tokenizer("The quick brown fox")["input_ids"]]
    body = {"prompt": prompts, "echo": True, "max_tokens": 6, "logprobs": 2, "n": 2, "temperature": 0}
    whole = sorted(ok(server, "/v1/completions", body)["choices"], key=lambda c: c["index"])
    chunks = [c["choices"][0] for c in streamed(server, "/v1/completions", body) if c["choices"]]
    for choice in whole:
        parts = [c for c in chunks if c["index"] == choice["index"]]
        assert parts[0]["text"].startswith(tokenizer.decode(prompts[choice["index"] // 2], skip_special_tokens=False))
        assert "".join(p["text"] for p in parts) == choice["text"]
        joined = {k: [x for p in parts if p["logprobs"] for x in p["logprobs"][k]] for k in choice["logprobs"]}
        assert joined["tokens"] == choice["logprobs"]["tokens"]
        assert joined["text_offset"] == choice["logprobs"]["text_offset"]
        assert joined["token_logprobs"] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=ATOL)


def test_echo_scoring_with_top_alternatives(server, tiny_lm):
    model, tokenizer = tiny_lm
    prompt = tokenizer("hello there, friend")["input_ids"]
    out = ok(server, "/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 0, "logprobs": 2})
    lp = out["choices"][0]["logprobs"]
    ref = reference(model, prompt, [])
    assert lp["top_logprobs"][0] is None
    for j in range(1, len(prompt)):
        best = torch.topk(ref[j], 2)
        assert {TokenPieces(tokenizer).label(t) for t in best.indices.tolist()} <= set(lp["top_logprobs"][j])


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs", ["from 0 to 20"]),
        ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs", ["from 0 to 20"]),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs", ["from 0 to 20"]),
        ("/v1/completions", {"prompt": "x", "top_logprobs": 2}, "top_logprobs", ["chat field"]),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", ["logprobs: true"]),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", ["from 0 to 20"]),
        ("/v1/chat/completions", {"logprobs": 3}, "logprobs", ["boolean"]),
    ],
)
def test_bad_logprobs_requests_get_400(server, path, body, param, words):
    if path.endswith("chat/completions"):
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
    assert_error(post(server, path, body), 400, param, words)
