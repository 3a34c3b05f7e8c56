"""Start the ranks of a multi-process test: `torchrun --standalone` (a free port, torchrun's environment, as users
launch), 2 CPU processes, bounded in time, killed with their whole process group on timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_ranks(case: str, out_dir: Path, *args: str, num_ranks: int = 2, timeout: float = 240) -> list[dict]:
    """Run `tests.distributed.workers CASE` on `num_ranks` processes; return each rank's JSON, rank order. The bound
    is generous: torchrun, 2 interpreters importing torch and transformers, and gloo take minutes on 2 busy cores."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={num_ranks}",
               "-m", "tests.distributed.workers", case, str(out_dir), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: torchrun and every rank it started
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"{case} on {num_ranks} ranks took over {timeout}s; killed. Log tail:\n{log[-6000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{case} on {num_ranks} ranks exited {proc.returncode}. Log tail:\n{log[-6000:]}")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(num_ranks)]
