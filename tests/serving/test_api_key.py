"""`--api-key` / HF_PAGED_API_KEY: requests without `Authorization: Bearer <key>` get 401 with an OpenAI error body;
/health and /metrics stay open; the key is compared in constant time."""

from __future__ import annotations

import argparse
import hmac

import httpx
import openai
import pytest

from hf_paged.errors import CliError
from hf_paged.serving import ServerSettings, auth
from hf_paged.serving.server import add_serve_arguments, serve_api_key
from tests.serving.conftest import make_server, wait_idle

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def keyed(tiny_lm):
    server, engine = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", api_key=KEY))
    with server:
        yield server, engine


def _assert_401(response):
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in body["error"]["message"] and KEY not in response.text


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {KEY}"},
                                     {"authorization": KEY}, {"authorization": f"Bearer {KEY}x"},
                                     {"authorization": f"Bearer {KEY[:-1]}"}, {"x-api-key": KEY}])
def test_requests_without_the_key_get_401(keyed, headers):
    server, engine = keyed
    for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                         ("POST", "/tokenize"), ("GET", "/openapi.json"), ("GET", "/nowhere")):
        response = httpx.request(method, server.url + path, headers=headers, timeout=60,
                                 json={"prompt": "a", "max_tokens": 2} if method == "POST" else None)
        _assert_401(response)
    assert not engine.requests


def test_the_key_lets_requests_through_and_health_and_metrics_stay_open(keyed):
    server, engine = keyed
    for scheme in ("Bearer", "bearer"):
        answer = httpx.post(server.url + "/v1/completions", headers={"authorization": f"{scheme} {KEY}"},
                            json={"prompt": "def main():", "max_tokens": 3, "temperature": 0}, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)  # the client sends the key as a Bearer token
    assert client.chat.completions.create(model="tiny-lm", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2).choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").models.list()
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200
    metrics = httpx.get(server.url + "/metrics", timeout=60)
    assert metrics.status_code == 200
    assert 'hf_paged:request_rejected_total{model_name="tiny-lm",status="401"}' in metrics.text
    wait_idle(engine)


def test_the_key_is_compared_in_constant_time(monkeypatch):
    """Digests of equal length go to `hmac.compare_digest`, whatever the length of the guess: neither how much of
    the key a guess got right nor the key's length shows in the time taken."""
    seen, compare = [], hmac.compare_digest

    def spy(a, b):
        seen.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    gate = auth.ApiKeyAuth(None, KEY).check
    for guess in (b"", b"s", KEY[:-1].encode(), KEY.encode(), KEY.encode() * 10):
        assert gate.authorized([(b"authorization", b"Bearer " + guess)]) == (guess == KEY.encode())
    assert seen == [(32, 32)] * 5
    assert not gate.authorized([(b"authorization", f"Bearer {KEY}".encode())] * 2)  # two headers: refused
    with pytest.raises(ValueError, match="api_key is empty"):
        auth.ApiKeyAuth(None, "")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flag_and_the_environment_variable(monkeypatch):
    monkeypatch.delenv(auth.API_KEY_ENV, raising=False)
    assert serve_api_key(_args()) is None
    assert serve_api_key(_args("--api-key", "k1")) == "k1"
    monkeypatch.setenv(auth.API_KEY_ENV, "k2")
    assert serve_api_key(_args()) == "k2"
    assert serve_api_key(_args("--api-key", "k1")) == "k1"  # the flag wins
    monkeypatch.setenv(auth.API_KEY_ENV, " ")
    with pytest.raises(CliError, match="HF_PAGED_API_KEY is empty"):
        serve_api_key(_args())
    with pytest.raises(CliError, match="--api-key is empty"):
        serve_api_key(_args("--api-key", ""))
