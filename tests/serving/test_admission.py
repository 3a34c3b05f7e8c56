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
