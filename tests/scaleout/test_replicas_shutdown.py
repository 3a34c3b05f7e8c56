"""`hf-paged serve --replicas 2` as a user runs it: SIGTERM drains, aborts what is left, exits 0, leaves nothing.

One local Ray cluster, started by the command itself (its own temporary directory), ~40 s on 2 CPU cores.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time

import pytest

from tests.ports import free_port
from tests.scaleout.replicas_cli import alive, start_replicas

pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")


def test_sigterm_drains_aborts_the_rest_exits_0_and_leaves_no_process_or_file():
    tmp = tempfile.mkdtemp(prefix="hfp", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    port = free_port()
    command = start_replicas(port, tmp, 2)
    proc, output, ready, reader = command.proc, command.output, command.ready, command.reader
    try:
        assert ready.wait(420), "".join(output[-30:])  # ~40 s quiet; past 240 s at load ~20 beside other Ray clusters
        processes = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        assert len(processes) >= 8  # driver, gcs, raylet, agents, controller, proxy, gateway, 2 replicas
        base = f"http://127.0.0.1:{port}"
        answer: dict = {}
        first_chunk = threading.Event()

        def long_stream() -> None:  # in flight at SIGTERM and longer than --shutdown-timeout: aborted
            body = {"prompt": "a long answer", "max_tokens": 1500, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
                lines = []
                for line in r.iter_lines():
                    lines.append(line)
                    first_chunk.set()
                answer.update(status=r.status_code, lines=[x for x in lines if x.startswith("data: ")])

        streamer = threading.Thread(target=long_stream)
        streamer.start()
        assert first_chunk.wait(60)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        refused = None
        # until a refusal, while the server lives: the drain's 2 s start when the gateway hears of the signal, which a
        # loaded machine delays past a fixed 2 s after `sent`
        while refused is None and proc.poll() is None and time.monotonic() - sent < 60:
            try:
                r = httpx.post(f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
            except httpx.TransportError:
                break  # the server is gone
            refused = r.json()["error"]["code"] if r.status_code == 503 else None
        assert refused == "shutting_down"
        status = proc.wait(timeout=60)
        exited = time.monotonic()
        streamer.join(timeout=10)
        assert status == 0, "".join(output[-30:])
        assert exited - sent >= 2  # the stream had its --shutdown-timeout
        assert answer["status"] == 200 and answer["lines"][-1] == "data: [DONE]"
        assert '"code": "shutting_down"' in answer["lines"][-2], answer["lines"][-3:]
        while alive(processes) and time.monotonic() - exited < 10:
            time.sleep(0.2)
        left = [" ".join(p.cmdline())[:80] for p in alive(processes)]
        assert not left, f"still running 10 s after exit: {left}"
        reader.join(timeout=5)
        assert "SIGTERM received" not in "".join(output)
        ray_dirs = [name for name in os.listdir(tmp) if name.startswith("hf_paged-ray-")]
        assert not ray_dirs, ray_dirs  # the cluster's session (sockets, logs) removed
        print(f"{len(processes)} processes; exit 0 {exited - sent:.1f} s after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
