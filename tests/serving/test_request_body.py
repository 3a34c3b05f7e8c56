"""Request bodies: a bound in bytes (413 with an OpenAI error body, read no further) and big bodies decoded beside
the event loop, so the streams a server is sending keep flowing while it decodes them."""

from __future__ import annotations

import gzip
import json
import threading

import httpx
import pytest

import hf_paged.serving.app as app_module
from hf_paged.serving import ServerSettings
from hf_paged.serving.body import OFF_LOOP_BYTES
from tests.serving.conftest import make_server
from tests.serving.test_errors import assert_error, post


@pytest.fixture(scope="module")
def small_limit_server(tiny_lm):
    server, _ = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", max_request_bytes=64 * 1024))
    with server:
        yield server


def test_a_body_past_the_limit_gets_413_from_its_declared_length(small_limit_server):
    error = assert_error(post(small_limit_server, "/v1/completions", {"prompt": "x" * 70_000, "max_tokens": 1}), 413,
                         None, ["65,536", "--max-request-bytes"])
    assert error["code"] == "request_too_large"


def test_a_chunked_body_past_the_limit_gets_413_once_the_count_passes_it(small_limit_server):
    def chunks():  # no content-length: the server counts what it reads
        yield b'{"prompt": "'
        for _ in range(40):
            yield b"x" * 4096
        yield b'", "max_tokens": 1}'

    response = httpx.post(small_limit_server.url + "/v1/completions", content=chunks(),
                          headers={"content-type": "application/json"}, timeout=60)
    assert_error(response, 413, None, ["more than 65,536 bytes"])


def test_a_body_under_the_limit_runs(small_limit_server):
    response = post(small_limit_server, "/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert response.status_code == 200, response.text


def test_big_bodies_are_decoded_off_the_event_loop(tiny_lm, monkeypatch):
    threads: list[tuple[int, str]] = []
    real = app_module.decode_request

    def recording(raw, model, name):
        threads.append((len(raw), threading.current_thread().name))
        return real(raw, model, name)

    monkeypatch.setattr(app_module, "decode_request", recording)
    server, _ = make_server(tiny_lm)
    with server:
        small = {"prompt": "hello", "max_tokens": 1}
        big = {"prompt": [5] * (OFF_LOOP_BYTES // 3), "max_tokens": 1}  # "5, " per id: past OFF_LOOP_BYTES
        assert post(server, "/v1/completions", small).status_code == 200
        assert_error(post(server, "/v1/completions", big), 400, "prompt", ["maximum context length"])
        assert post(server, "/v1/completions", json.dumps(small)).status_code == 200
    (small_size, loop_thread), (big_size, worker), _ = threads
    assert small_size <= OFF_LOOP_BYTES < big_size
    assert worker != loop_thread  # decoded in a worker thread, not on the event loop's


@pytest.mark.parametrize(("path", "raw"), [
    ("/v1/completions", b'{"prompt": "\\ud800abc", "max_tokens": 3}'),  # the tokenizer raised TypeError: a 500
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 3, "guided_choice": ["\\udfff", "b"]}'),  # UnicodeEncodeError
    ("/tokenize", b'{"prompt": "\\uD83D"}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\udc00"}], "max_tokens": 3}'),
])
def test_a_lone_surrogate_escape_is_a_400(server, path, raw):
    error = assert_error(post(server, path, raw), 400, words=["lone UTF-16 surrogate"])
    assert error["code"] == "invalid_json"


def test_a_surrogate_pair_is_one_character(server, tiny_lm):
    r = post(server, "/tokenize", b'{"prompt": "\\ud83d\\ude00", "add_special_tokens": false}')
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tiny_lm.tokenizer("\U0001F600", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("media_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_body_that_is_not_declared_json_gets_415(small_limit_server, media_type):
    """A web page can POST `text/plain` or a form to a server on localhost without the browser asking first (no
    CORS preflight): only JSON (or no Content-Type at all) is read."""
    body = json.dumps({"prompt": "hello", "max_tokens": 1})
    response = httpx.post(small_limit_server.url + "/v1/completions", content=body,
                          headers={"content-type": media_type}, timeout=60)
    error = assert_error(response, 415, None, [repr(media_type), "application/json"])
    assert error["code"] == "unsupported_media_type"


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/json; charset=utf-8"},
                                     {"content-type": "Application/JSON"}, {"content-type": "application/x-ld+json"}])
def test_json_or_no_content_type_is_read(small_limit_server, headers):
    body = json.dumps({"prompt": "hello", "max_tokens": 1})
    response = httpx.post(small_limit_server.url + "/v1/completions", content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("field", ["max_tokens", "seed", "n"])
def test_a_number_past_pythons_digit_limit_is_a_400(small_limit_server, field):
    """json.loads raises a bare ValueError for an integer of more than 4,300 digits: it was a 500."""
    raw = b'{"prompt": "hello", "%s": 1%s}' % (field.encode(), b"0" * 5000)
    error = assert_error(post(small_limit_server, "/v1/completions", raw), 400, None, ["number too long", "4,300"])
    assert error["code"] == "invalid_json"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_a_compressed_body_gets_415_naming_its_encoding(small_limit_server, encoding):
    """A compressed body is not inflated (a small body must not become a large one): the answer says so instead of
    'not valid JSON (byte 0x8b)'."""
    body = gzip.compress(json.dumps({"prompt": "hello", "max_tokens": 1}).encode())
    response = httpx.post(small_limit_server.url + "/v1/completions", content=body, timeout=60,
                          headers={"content-type": "application/json", "content-encoding": encoding})
    error = assert_error(response, 415, None, [repr(encoding), "uncompressed"])
    assert error["code"] == "unsupported_media_type"


def test_an_identity_content_encoding_is_read(small_limit_server):
    response = httpx.post(small_limit_server.url + "/v1/completions", timeout=60,
                          content=json.dumps({"prompt": "hello", "max_tokens": 1}),
                          headers={"content-type": "application/json", "content-encoding": "identity"})
    assert response.status_code == 200, response.text
