"""`guided_number_digits` (h77): a server user bounds a JSON constraint's number digits, as
`JSONSchemaLogitsProcessor(number_digits=NumberDigits(...))` does in Python. A real server on 127.0.0.1 (an
ephemeral port)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")
import httpx

from hf_paged.processors import NumberDigits
from tests.serving.conftest import make_server, wait_idle

SCHEMA = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"], "additionalProperties": False}


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def test_guided_number_digits_bounds_the_numbers_and_is_refused_where_it_cannot_apply(tiny_lm):
    server, engine = make_server(tiny_lm)
    with server:
        body = {"prompt": "A value as JSON: ", "max_tokens": 60, "temperature": 1.0, "seed": 3, "n": 6,
                "guided_json": SCHEMA, "guided_number_digits": {"integer": 2, "fraction": 1}}
        response = post(server.url, body)
        assert response.status_code == 200, response.text
        for choice in response.json()["choices"]:
            assert choice["finish_reason"] == "stop", choice
            number = json.loads(choice["text"])["x"]
            text = re.search(r'"x"\s*:\s*(\S+?)\s*}', choice["text"]).group(1)
            assert re.fullmatch(r"-?[0-9]{1,2}(\.[0-9])?([eE][+-]?[0-9]{1,3})?", text), text  # exponent: default
            assert isinstance(number, (int, float))
        # the same draws without the field: the integer parts run away (e.g. 7311223355049855044885504E8)
        unbounded = post(server.url, {k: v for k, v in body.items() if k != "guided_number_digits"}).json()
        assert any(re.search(r'"x"\s*:\s*-?[0-9]{3}', c["text"]) for c in unbounded["choices"])
        # the processor the server built carries the bounds, the parts left out the default's
        cache = server.app.state.server.preparer.constraints
        built = [cache._items.peek(key) for key in list(cache._items)]
        assert [p.number_digits for p in built] == [NumberDigits(2, 1, 3), None]
        refused = [
            ({"guided_regex": "a+", "guided_number_digits": {"integer": 2}}, ["JSON constraints"]),
            ({"guided_number_digits": {"integer": 2}}, ["JSON constraints"]),
            ({"guided_json": SCHEMA, "guided_number_digits": {"integer": 0}}, ["greater than or equal to 1"]),
            ({"guided_json": SCHEMA, "guided_number_digits": {"integer": "2"}}, []),
            ({"guided_json": SCHEMA, "guided_number_digits": {"digits": 2}}, ["Extra inputs"]),
        ]
        for extra, words in refused:
            bad = post(server.url, {"prompt": "x", "max_tokens": 4, **extra})
            assert bad.status_code == 400, (extra, bad.text)
            error = bad.json()["error"]
            assert error["param"].startswith("guided_number_digits"), error
            assert all(w in error["message"] for w in words), error
        wait_idle(engine)


def test_a_prefill_replica_gets_no_guided_number_digits():
    """Disaggregated serving (`--kv-role`): the prefill body drops the answer's constraint fields; with the
    constraint gone, a `guided_number_digits` left behind would be a 400 on the prefill side."""
    pytest.importorskip("ray")
    from hf_paged.scaleout.kv_roles import prefill_body

    body = {"prompt": "x", "guided_json": SCHEMA, "guided_number_digits": {"integer": 2}}
    assert json.loads(prefill_body(json.dumps(body).encode())) == {"prompt": "x", "max_tokens": 1, "n": 1,
                                                                   "stream": False}
