"""`hf-paged serve --replicas 2` run by a test as a user runs it: the command, its output followed, and the processes
it started (the shutdown tests signal it and check that none is left)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field


@dataclass
class ReplicasCommand:
    proc: subprocess.Popen
    output: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)  # it printed its address
    reader: threading.Thread | None = None


def start_replicas(port: int, tmp: str, shutdown_timeout: float, **popen) -> ReplicasCommand:
    """The command on `port` with TMPDIR `tmp` (Ray's sockets: keep it short), its output read by a thread."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hf_paged.cli", "serve", "--replicas", "2", "--port", str(port), "--block-size", "16",
         "--num-blocks", "512", "--shutdown-timeout", str(shutdown_timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "TMPDIR": tmp}, **popen)
    command = ReplicasCommand(proc)

    def read() -> None:
        for line in proc.stdout:
            command.output.append(line)
            if f" on http://127.0.0.1:{port} " in line:
                command.ready.set()

    command.reader = threading.Thread(target=read, daemon=True)
    command.reader.start()
    return command


def alive(processes: list) -> list:
    """Those of `processes` still running (zombies are not)."""
    import psutil  # (Ray's dependency: the tests that start the command skip without Ray)

    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
