"""`hf-paged serve` binds its socket before it prints its URL: `--port 0` prints the port the system picked (it
printed `:0`), and a port in use is one error line and exit status 2 (it printed the URL, then uvicorn's error, exit 3)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}


def _serve(*flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hf_paged.cli", "serve", "--host", "127.0.0.1", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, text=True)


def test_port_0_prints_the_port_it_listens_on():
    proc = _serve("--port", "0", "--log-level", "info")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        found = None
        while found is None:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-2000:]
            found = next((m for m in map(re.compile(r"serving \S+ on (http://127\.0\.0\.1:(\d+))").search, lines)
                          if m), None)
            time.sleep(0.05)
        url, port = found.group(1), int(found.group(2))
        assert port != 0
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_port_in_use_is_one_error_line_and_exit_2():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = _serve("--port", str(port))
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-2000:]
    errors = [line for line in out.splitlines() if line.startswith("hf-paged: error:")]
    assert len(errors) == 1 and f"cannot listen on 127.0.0.1:{port}" in errors[0] and "--port" in errors[0]
    assert "serving" not in out and "Traceback" not in out
