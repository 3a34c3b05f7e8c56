"""--max-waiting counts every sequence a request puts in the queue: prompts x `n`, and with echo and logprobs
the prompts' scoring requests beside the generation."""

from __future__ import annotations

import httpx

from hf_paged.serving import ServerSettings
from tests.serving.conftest import make_server, wait_idle


def test_echo_with_logprobs_counts_its_scoring_requests_in_the_bound(tiny_lm):
    server, engine = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", max_waiting=8))
    prompts = ["hello world, how are you", "the quick brown fox", "import os\nimport sys"]
    with server:
        body = {"prompt": prompts, "n": 2, "max_tokens": 2, "temperature": 1.0, "echo": True, "logprobs": 0}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 400, r.text  # 3 x 2 generated + 3 scored = 9 > 8
        message = r.json()["error"]["message"]
        assert "9 sequences (3 prompts x n=2 + 3 prompts' scoring (echo with logprobs))" in message
        assert "--max-waiting" in message
        no_logprobs = {key: value for key, value in body.items() if key != "logprobs"}  # 6: no scoring
        assert httpx.post(server.url + "/v1/completions", json=no_logprobs, timeout=120).status_code == 200
        at_bound = {**body, "prompt": prompts[:2]}  # 2 x 2 + 2 = 6
        r = httpx.post(server.url + "/v1/completions", json=at_bound, timeout=120)
        assert r.status_code == 200, r.text
        assert all(choice["logprobs"]["token_logprobs"][0] is None for choice in r.json()["choices"])
        wait_idle(engine, timeout=60)
        assert server.app.state.server.num_admitted == 0  # every admitted sequence was queued or released


def test_the_queue_is_bounded_by_default_relative_to_the_batch(tiny_lm):
    """No `max_waiting`: 64 full batches (`max_num_seqs`) of sequences; 0: no bound."""
    from hf_paged.serving.admission import DEFAULT_WAITING_BATCHES, waiting_bound

    assert waiting_bound(None, 128) == DEFAULT_WAITING_BATCHES * 128 == 8192
    assert waiting_bound(0, 128) is None and waiting_bound(5, 128) == 5
    server, engine = make_server(tiny_lm, max_num_seqs=2)
    with server:
        assert server.app.state.server.gate.max_waiting == DEFAULT_WAITING_BATCHES * 2
        body = {"prompt": ["a", "b"], "n": 65, "max_tokens": 1, "temperature": 1.0}  # 130 > 128 sequences
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 400 and "--max-waiting" in r.json()["error"]["message"], r.text
    unbounded, _ = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", max_waiting=0), max_num_seqs=2)
    with unbounded:
        assert unbounded.app.state.server.gate.max_waiting is None


def test_a_request_past_the_bound_is_refused_before_its_prompts_are_tokenized(tiny_lm, monkeypatch):
    """100,000 one-character prompts were tokenized (7.6 s) before the 400 that their count alone decides."""
    from hf_paged.serving.prepare import Preparer

    calls = []
    real = Preparer.tokenize

    def counting(self, text, param, **kwargs):
        calls.append(text)
        return real(self, text, param, **kwargs)

    monkeypatch.setattr(Preparer, "tokenize", counting)
    server, engine = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", max_waiting=8))
    with server:
        for body in ({"prompt": ["x"] * 20, "max_tokens": 1}, {"prompt": "x", "n": 9, "max_tokens": 1},
                     {"prompt": ["x"] * 20, "max_tokens": 0, "echo": True, "logprobs": 0}):
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large", r.text
            assert "--max-waiting" in r.json()["error"]["message"]
        assert calls == []
        r = httpx.post(server.url + "/v1/completions", json={"prompt": ["x"] * 8, "max_tokens": 1}, timeout=120)
        assert r.status_code == 200 and len(calls) == 8
        wait_idle(engine, timeout=60)
        assert server.app.state.server.num_admitted == 0
