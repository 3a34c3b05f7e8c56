"""A real uvicorn server on 127.0.0.1 (an ephemeral port) in a thread of the test process, over the embedded model."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from hf_paged import Engine, PagedConfig, default_model  # noqa: E402
from hf_paged.serving import ServerSettings, build_app  # noqa: E402


class ServerThread:
    """Runs `app` under uvicorn until the `with` block ends; `url` is its base URL."""

    def __init__(self, app) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 120  # generous: CI shares 2 cores with other jobs
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="session")
def tiny_lm():
    return default_model()


def make_server(tiny_lm, *, settings: ServerSettings | None = None, **config) -> tuple[ServerThread, Engine]:
    model, tokenizer = tiny_lm
    engine = Engine(model, PagedConfig(**{"block_size": 16, "num_blocks": 512, **config}))
    settings = settings or ServerSettings(model_name="tiny-lm")
    return ServerThread(build_app(engine, tokenizer, settings)), engine


def wait_idle(engine: Engine, timeout: float = 60.0) -> None:
    """Wait until the engine holds no request (aborts land before the next step), then check the pool."""
    deadline = time.monotonic() + timeout
    while (engine.requests or engine.loop.num_in_flight) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.requests and not engine.loop.num_in_flight, "requests still in the engine"
    with engine.lock:
        engine.check_integrity()
        assert engine.cache.pool.num_used_blocks == 0


@pytest.fixture(scope="module")
def served(tiny_lm):
    server, engine = make_server(tiny_lm)
    with server:
        yield server, engine


@pytest.fixture()
def server(served):
    """The module's server; after each test no request is left and no block is in use."""
    server, engine = served
    yield server
    wait_idle(engine)


@pytest.fixture()
def engine(served):
    return served[1]
