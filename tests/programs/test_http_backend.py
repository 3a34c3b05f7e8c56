"""The HTTP backend: the same programs against a real `hf-paged serve` (uvicorn on 127.0.0.1, an ephemeral port)
give the same fields, texts, finish reasons, attempts and generated/forced token counts as in process (greedy);
`select` scores within 1e-5; reuse from the server's prefix cache shows in the counts; a program that raises
aborts its requests on the server; a server that is down, a 400, a wrong model name get typed errors."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("fastapi")

import hf_paged
from hf_paged import Engine, PagedConfig
from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from hf_paged.errors import TokenizerError
from hf_paged.serving import ServerSettings, build_app
from tests.programs.conftest import tiny_byte_llama
from tests.serving.conftest import ServerThread, wait_idle

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def both():
    """(in-process model, tokenizer, server, server engine): the same weights, the same engine settings."""
    model, tok = tiny_byte_llama()
    hf_paged.wrap(model, block_size=16, num_blocks=256)
    served, _ = tiny_byte_llama()
    engine = Engine(served, PagedConfig(block_size=16, num_blocks=256))
    with ServerThread(build_app(engine, tok, ServerSettings(model_name="tiny"))) as server:
        yield model, tok, server, engine
    local = engine_of(model)
    local.check_integrity()
    assert local.cache.pool.num_used_blocks == 0


@pytest.fixture()
def setup(both):
    yield both
    wait_idle(both[3])


@hp.program
def ticket_flow(s, ticket):
    s += "Ticket: " + ticket + "\nIntent: " + hp.select("intent", ["billing", "complaint", "other"]) + "\n"
    s += "Code: " + hp.gen("code", max_tokens=8, regex=r"[A-Z]{2}[0-9]{3}") + "\n"
    s += "Level: " + hp.gen("level", choices=["low", "high"]) + "\n"
    s += "Data: " + hp.gen("data", max_tokens=12, schema=SCHEMA) + "\n"
    s += "Note: " + hp.gen("note", max_tokens=10, stop="\n") + "\n"
    for f in s.fork(2):
        f += "Option: " + hp.gen("option", max_tokens=8, stop="\n")
    return s["intent"]


def _same_records(local, remote):
    assert remote.text == local.text and remote.fields == local.fields
    assert remote.return_value == local.return_value
    for a, b in zip(local.calls, remote.calls, strict=True):
        assert (b.name, b.kind, b.value, b.finish_reason, b.valid) == (a.name, a.kind, a.value, a.finish_reason,
                                                                       a.valid)
        assert b.attempts == a.attempts
        assert (b.tokens.generated, b.tokens.forced, b.tokens.prompt, b.tokens.requests) == \
            (a.tokens.generated, a.tokens.forced, a.tokens.prompt, a.tokens.requests)
        if a.scores is not None:
            assert b.scores.keys() == a.scores.keys()
            assert max(abs(b.scores[c] - a.scores[c]) for c in a.scores) < 1e-5
    for fa, fb in zip(local.forks, remote.forks, strict=True):
        _same_records(fa, fb)


def test_a_program_over_http_equals_in_process(setup):
    model, tok, server, _ = setup
    local = ticket_flow.run(model, tok, ticket="my card was charged twice")
    remote = ticket_flow.run(hp.remote(server.url), tok, ticket="my card was charged twice")
    _same_records(local, remote)
    assert remote["option"] == local["option"] and len(remote["option"]) == 2
    totals = remote.tokens()
    assert totals.cached > 0 and totals.prompt == local.tokens().prompt
    # every call after the first extends the previous one's tokens: its full blocks come from the server's cache
    later = [c.tokens for c in remote.calls[1:] if c.kind == "gen"]
    assert all(t.cached >= 16 for t in later), [(t.prefilled, t.cached) for t in later]


def test_a_second_run_is_served_from_the_prefix_cache(setup):
    _, tok, server, _ = setup
    backend = hp.HTTPBackend(hp.remote(server.url), tok)  # one backend, made once, for several runs
    first = ticket_flow.run(backend, ticket="the app crashes when I log in, every single time")
    again = ticket_flow.run(backend, ticket="the app crashes when I log in, every single time")
    assert again.fields == first.fields
    assert again.tokens().hit_rate > first.tokens().hit_rate
    assert again.calls[0].tokens.cached >= 3 * 16  # the select's choices: the whole prompt's full blocks


def test_cache_retention_pins_each_prompt_on_the_server_for_a_while(setup):
    model, tok, server, engine = setup

    def pinned() -> int:
        with engine.lock:
            return engine.stats()["prefix_pinned_blocks"]

    local = ticket_flow.run(model, tok, ticket="pin my prefix while I think")
    remote = ticket_flow.run(hp.remote(server.url, cache_retention_s=3.0), tok, ticket="pin my prefix while I think")
    _same_records(local, remote)
    assert pinned() > 0  # the gens' prompts, pinned once computed
    deadline = time.monotonic() + 30
    while pinned():  # released when the 3 s are over
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(ValueError, match="cache_retention_s"):
        hp.remote(server.url, cache_retention_s=0)


def test_run_batch_and_fill_over_http_equal_in_process(setup):
    model, tok, server, _ = setup
    tickets = [{"ticket": t} for t in ("refund please", "the parcel never came", "thanks, all good")]
    local = ticket_flow.run_batch(model, tok, tickets)
    remote = ticket_flow.run_batch(hp.remote(server.url), tok, tickets)
    for a, b in zip(local, remote, strict=True):
        _same_records(a, b)
    template = '{"intent": "[intent]", "reply": "[reply]", "id": "[id]"}'
    holes = {"intent": ["billing", "complaint", "other"], "reply": hp.text(max_tokens=8),
             "id": hp.regex(r"[0-9]{4}")}
    for mode in ("item_by_item", "one_shot"):
        a = hp.fill(model, tok, "Ticket: charged twice.\n", template, mode=mode, **holes)
        b = hp.fill(hp.remote(server.url), tok, "Ticket: charged twice.\n", template, mode=mode, **holes)
        assert (b.text, b.fields) == (a.text, a.fields), mode
        assert [(d.finish_reason, d.attempts) for d in b.details.values()] == \
            [(d.finish_reason, d.attempts) for d in a.details.values()]
        assert (b.tokens.generated, b.tokens.forced, b.tokens.prompt) == \
            (a.tokens.generated, a.tokens.forced, a.tokens.prompt)


def test_retries_sample_with_the_same_seeds_over_http(setup):
    model, tok, server, _ = setup

    @hp.program
    def picky(s):
        s += "Word: " + hp.gen("word", max_tokens=4, regex="[a-z]{2,4}", validator=lambda v: v.startswith("q"),
                                max_retries=2, seed=7)

    local = picky.run(model, tok)
    remote = picky.run(hp.remote(server.url), tok)
    assert [a.seed for a in remote.calls[0].attempts] == [None, 8, 9]
    _same_records(local, remote)


def test_a_field_cut_at_its_budget_is_judged_alike_over_http(setup):
    model, tok, server, _ = setup

    @hp.program
    def cut(s):
        s += "Name: " + hp.gen("whole", max_tokens=6, regex=r"[a-z]{3,}") + "\n"
        s += "Name: " + hp.gen("part", max_tokens=6, regex=r"[a-z]{8,}")

    local = cut.run(model, tok)
    remote = cut.run(hp.remote(server.url), tok)
    _same_records(local, remote)
    assert [(c.finish_reason, c.tokens.generated) for c in remote.calls] == [("length", 7), ("length_incomplete", 7)]


def test_a_recursive_grammar_field_over_http_equals_in_process(setup):
    model, tok, server, _ = setup

    @hp.program
    def nested(s):
        s += "Expr: " + hp.gen("expr", grammar='start: "(" start ")" | "x"', max_tokens=9)
        s += "\nOk: " + hp.gen("ok", schema={"type": "boolean"}, max_tokens=4)

    local = nested.run(model, tok)
    remote = nested.run(hp.remote(server.url), tok)
    _same_records(local, remote)
    assert remote.calls[0].tokens.generated > 0


def test_a_program_that_raises_aborts_its_server_requests(setup):
    _, tok, server, engine = setup
    aborted = engine.metrics.num_requests_aborted

    @hp.program
    def broken(s):
        s += "Some prefix text for the forks. "
        for f in s.fork(2):
            f += hp.gen("long", max_tokens=400, regex="[a-z]{400}")
        deadline = time.monotonic() + 30
        while not engine.live_requests():  # the long generations are running on the server
            assert time.monotonic() < deadline
            time.sleep(0.01)
        raise RuntimeError("the program failed mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        broken.run(hp.remote(server.url), tok)
    wait_idle(engine)  # nothing left running, no block in use
    assert engine.metrics.num_requests_aborted > aborted


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_hostile_servers_and_requests_get_typed_errors(setup):
    _, tok, server, _ = setup
    with pytest.raises(hp.ServerUnavailableError, match="connection refused") as info:
        ticket_flow.run(hp.remote(f"http://127.0.0.1:{_closed_port()}"), tok, ticket="x")
    assert isinstance(info.value, ConnectionError)
    with pytest.raises(hp.ServerRequestError, match="serves \\['tiny'\\], not 'gpt-9'"):
        ticket_flow.run(hp.remote(server.url, model="gpt-9"), tok, ticket="x")

    @hp.program
    def too_long(s):
        s += "Text: " + hp.gen("text", max_tokens=600)

    with pytest.raises(hp.ServerRequestError, match="hp.gen\\('text'\\).*400.*maximum context length") as info:
        too_long.run(hp.remote(server.url), tok)
    assert info.value.status == 400 and info.value.param == "max_tokens"

    @hp.program
    def healed(s):
        s += "Intent: " + hp.gen("intent", max_tokens=4, heal=True)

    with pytest.raises(hp.FieldConstraintError, match="heal=True needs the in-process backend"):
        healed.run(hp.remote(server.url), tok)
    with pytest.raises(ValueError, match="http"):
        hp.remote("127.0.0.1:8000")
    with pytest.raises(ValueError, match="timeout"):
        hp.remote(server.url, timeout=0)
    with pytest.raises(TypeError, match="tokenizer"):
        ticket_flow.run(hp.remote(server.url), None, ticket="x")
    other = hf_paged.default_model().tokenizer  # another model's tokenizer: its ids would be other text
    with pytest.raises(TokenizerError, match="not the server's"):
        ticket_flow.run(hp.remote(server.url), other, ticket="x")


def test_a_request_past_the_timeout_is_a_typed_error(setup):
    _, tok, server, engine = setup

    @hp.program
    def slow(s):
        s += "Letters: " + hp.gen("letters", max_tokens=400, regex="[a-z]{400}")

    with pytest.raises(hp.ServerTimeoutError, match="no answer within 0.2 s"):
        slow.run(hp.remote(server.url, timeout=0.2), tok)
    wait_idle(engine)
