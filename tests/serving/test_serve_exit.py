"""`hf-paged serve` after SIGTERM: once the server has stopped, the process ends without the interpreter's last
collections walking the engine's long-lived objects (they kept it alive ~10 s after uvicorn's 'Finished')."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import threading
import time

import httpx

from hf_paged.serving.server import add_serve_arguments, run_serve
from tests.ports import free_port


def test_run_serve_leaves_the_collector_little_to_walk_at_exit():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    port = free_port()
    args = parser.parse_args(["--port", str(port), "--shutdown-timeout", "1", "--log-level", "warning",
                              "--num-blocks", "4096"])
    stopped = threading.Event()

    def stop_when_up() -> None:  # SIGTERM to this process once the server answers (its handlers are installed)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stopped.is_set():
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                                      json={"prompt": "hello", "max_tokens": 4}).status_code == 200
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
            except httpx.TransportError:
                time.sleep(0.1)

    thread = threading.Thread(target=stop_when_up, daemon=True)
    thread.start()
    try:
        assert run_serve(args) == 0
        left = len(gc.get_objects())  # what a full collection (the interpreter's last ones) walks now
    finally:
        stopped.set()
        gc.unfreeze()
    thread.join(timeout=10)
    assert left < 50_000, f"{left:,} objects left for the collector after the server stopped"
