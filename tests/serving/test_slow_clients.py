"""Slowloris: a connection that trickles its request head is closed at the header deadline
(`serving/connections.py`); a request in progress (a long stream, a slow body) and an ordinary keep-alive client
are not."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from hf_paged.serving.connections import header_deadline_protocol
from hf_paged.serving.server import add_serve_arguments, checked_paged_config
from tests.serving.conftest import make_server

DEADLINE_S = 1.0


@pytest.fixture(scope="module", params=["httptools", "h11"])
def deadline_server(tiny_lm, request):
    if request.param == "httptools":
        pytest.importorskip("httptools")
    server, engine = make_server(tiny_lm)
    server.server = uvicorn.Server(uvicorn.Config(server.app, log_level="warning", timeout_graceful_shutdown=5,
                                                  http=header_deadline_protocol(DEADLINE_S, request.param)))
    server.thread = threading.Thread(target=server.server.run, kwargs={"sockets": [server.sock]}, daemon=True)
    with server:
        yield server


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _closed_within(sock: socket.socket, trickle: bytes, seconds: float) -> bool:
    """Send `trickle` every 0.1 s; True once the server has closed the connection."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(trickle)
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset / broken pipe: closed
            return True
    return False


def test_a_trickled_request_head_is_cut_at_the_deadline(deadline_server):
    sock = _connect(deadline_server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    assert _closed_within(sock, b"X-a: b\r\n", DEADLINE_S * 10)  # (without the deadline: open forever)
    sock.close()


def test_a_silent_connection_is_cut_at_the_deadline(deadline_server):
    sock = _connect(deadline_server)
    assert _closed_within(sock, b"", DEADLINE_S * 10)
    sock.close()


def test_a_long_stream_and_a_slow_body_are_not_cut(deadline_server):
    body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}
    start = time.monotonic()
    with httpx.stream("POST", deadline_server.url + "/v1/completions", json=body, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) > 3
    slow = b'{"prompt": "hello", "max_tokens": 2}'
    sock = _connect(deadline_server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(slow))
    for i in range(0, len(slow), 8):  # the head is complete: a body trickled past the deadline is still read
        sock.sendall(slow[i:i + 8])
        time.sleep(DEADLINE_S / 3)
    sock.settimeout(60)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.close()
    assert time.monotonic() - start > DEADLINE_S


def test_a_keep_alive_client_reuses_its_connection(deadline_server):
    with httpx.Client(timeout=60) as client:
        for _ in range(3):
            r = client.post(deadline_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 200
            time.sleep(DEADLINE_S * 0.6)  # within the deadline each time, past it in all


def test_the_flag_is_checked():
    import argparse

    from hf_paged.errors import CliError

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    for bad in ("0", "-1", "inf"):
        with pytest.raises(CliError, match="--header-timeout"):
            checked_paged_config(parser.parse_args(["--header-timeout", bad]))
    with pytest.raises(CliError, match="--replicas"):
        checked_paged_config(parser.parse_args(["--header-timeout", "5", "--replicas", "2"]))
    with pytest.raises(ValueError, match="header_timeout_s"):
        header_deadline_protocol(0)
