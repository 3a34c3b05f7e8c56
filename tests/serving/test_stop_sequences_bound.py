"""`--max-stop-sequences`: a request's `stop` list is bounded (the engine checks every string after each token of
the request, on the thread all requests step on). With `--replicas`: tests/scaleout/test_cli_replicas.py."""

from __future__ import annotations

import httpx
import pytest

from hf_paged.serving import ServerSettings
from hf_paged.serving.prepare import DEFAULT_MAX_STOP_SEQUENCES
from tests.serving.conftest import make_server


def _stops(n: int) -> list[str]:
    return [f"zq{i:05d}" for i in range(n)]  # strings the tiny model does not write: the answer runs to max_tokens


def test_more_stop_strings_than_the_bound_get_a_400_naming_the_field_and_the_flag(tiny_lm):
    server, _ = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", max_stop_sequences=3))
    with server, httpx.Client(base_url=server.url, timeout=60) as client:
        body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
        assert client.post("/v1/completions", json={**body, "stop": _stops(3)}).status_code == 200
        for route, extra in (("/v1/completions", body),
                             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                       "max_tokens": 3})):
            response = client.post(route, json={**extra, "stop": _stops(4)})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "stop" and "--max-stop-sequences" in error["message"], error
            assert "4 sequences" in error["message"] and "at most 3" in error["message"]


def test_no_bound_with_zero_and_the_default_takes_lm_evals_until_lists(tiny_lm):
    assert DEFAULT_MAX_STOP_SEQUENCES >= 16 and ServerSettings().max_stop_sequences == DEFAULT_MAX_STOP_SEQUENCES
    server, _ = make_server(tiny_lm, settings=ServerSettings(model_name="tiny-lm", max_stop_sequences=0))
    with server, httpx.Client(base_url=server.url, timeout=60) as client:
        body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0, "stop": _stops(DEFAULT_MAX_STOP_SEQUENCES + 1)}
        assert client.post("/v1/completions", json=body).status_code == 200


def test_the_flag_is_checked_and_reaches_the_server_settings(monkeypatch):
    import hf_paged.serving
    from hf_paged.cli import main
    from hf_paged.serving import server as serve_module

    assert main(["serve", "--max-stop-sequences", "-1"]) == 2  # a CliError: exit 2, before any model loads
    seen = {}

    class Built(Exception):
        pass

    def fake_build_app(engine, tokenizer, settings):
        seen["settings"] = settings
        raise Built

    monkeypatch.setattr(serve_module, "_start_engine", lambda args, config: (None, None, "tiny"))
    monkeypatch.setattr(hf_paged.serving, "build_app", fake_build_app)  # (run_serve imports it when it runs)
    with pytest.raises(Built):
        main(["serve", "--max-stop-sequences", "7"])
    assert seen["settings"].max_stop_sequences == 7
    with pytest.raises(Built):
        main(["serve"])
    assert seen["settings"].max_stop_sequences == DEFAULT_MAX_STOP_SEQUENCES
