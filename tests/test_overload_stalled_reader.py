"""A client that stops reading a response but keeps its socket open (`serving/connections.py`, send_timeout_s).

Without the send deadline uvicorn paused the handler at its next write forever: the engine ran the request on to
`max_tokens` into a buffer nobody read, and the connection stayed open. With it, the connection is aborted once its
writes stay paused for `send_timeout_s`, and the request is aborted like one whose client closed: the engine
computes far fewer than `max_tokens` tokens. The server's socket and write buffers are shrunk here so that a few
hundred tokens fill them (on loopback the kernel otherwise absorbs megabytes)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
import uvicorn

from hf_paged import default_model
from hf_paged.serving.connections import header_deadline_protocol
from tests.serving.conftest import make_server, wait_idle
from tests.serving.test_disconnects import _counters

SEND_TIMEOUT_S = 0.5
MAX_TOKENS = 1500


def _small_buffers(base: type) -> type:
    class SmallBuffers(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            transport.set_write_buffer_limits(high=4096)
            super().connection_made(transport)

    return SmallBuffers


@pytest.fixture(scope="module", params=["httptools", "h11"])
def stall_server(request):
    if request.param == "httptools":
        pytest.importorskip("httptools")
    server, engine = make_server(default_model())
    protocol = _small_buffers(header_deadline_protocol(30.0, request.param, send_timeout_s=SEND_TIMEOUT_S))
    server.server = uvicorn.Server(uvicorn.Config(server.app, log_level="warning", timeout_graceful_shutdown=5,
                                                  http=protocol))
    server.thread = threading.Thread(target=server.server.run, kwargs={"sockets": [server.sock]}, daemon=True)
    with server:
        yield server, engine


def _stalled_stream(server) -> socket.socket:
    """Send a long streaming request and never read the answer (the socket stays open)."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect((host, int(port)))
    body = json.dumps({"prompt": "x", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
                       "logprobs": 5}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def _generated_tokens(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("hf_paged:generation_tokens_total"))


def test_a_stalled_reader_is_cut_and_its_request_aborted(stall_server):
    server, engine = stall_server
    before, tokens_before = _counters(server), _generated_tokens(server)
    sock = _stalled_stream(server)
    try:
        deadline = time.monotonic() + 120  # a bound on waiting, not an assert on speed
        while _counters(server)["request_added"] == before["request_added"] and time.monotonic() < deadline:
            time.sleep(0.05)
        wait_idle(engine, timeout=120)
        after = _counters(server)
        assert after["request_aborted"] - before["request_aborted"] == 1  # (without the deadline: finished)
        assert after["request_finished"] == before["request_finished"]
        assert 0 < _generated_tokens(server) - tokens_before < MAX_TOKENS
        port = sock.getsockname()[1]
        while _open(server, port) and time.monotonic() < deadline:  # the server closed our connection
            time.sleep(0.05)
        assert not _open(server, port)
    finally:
        sock.close()


def _open(server, client_port: int) -> bool:
    return any(c.client and c.client[1] == client_port for c in list(server.server.server_state.connections))


def test_a_slow_reader_that_keeps_reading_is_not_cut(stall_server):
    server, engine = stall_server
    body = {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True, "logprobs": 5}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        lines = []
        for line in filter(None, r.iter_lines()):
            lines.append(line)
            if len(lines) % 40 == 0:
                time.sleep(SEND_TIMEOUT_S / 4)  # pauses shorter than the deadline: never cut
    assert lines[-1] == "data: [DONE]"
    wait_idle(engine)


def test_the_send_timeout_is_checked():
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="send_timeout_s"):
            header_deadline_protocol(send_timeout_s=bad)


def test_the_send_timeout_flag_is_checked():
    import argparse

    from hf_paged.errors import CliError
    from hf_paged.serving.server import add_serve_arguments, checked_paged_config

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert parser.parse_args(["--send-timeout", "5"]).send_timeout == 5.0
    for bad in ("0", "-1", "inf"):
        with pytest.raises(CliError, match="--send-timeout"):
            checked_paged_config(parser.parse_args(["--send-timeout", bad]))
    with pytest.raises(CliError, match="--send-timeout"):
        checked_paged_config(parser.parse_args(["--send-timeout", "5", "--replicas", "2"]))
