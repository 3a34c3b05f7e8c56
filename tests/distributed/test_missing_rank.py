"""`hf_paged.distributed.generate_batch` called on some ranks only: the calling ranks waited in the call's first
collective; past the process group's timeout they got the backend's bare timeout. The contract (README: call it on
every rank) now fails with `InvalidConfigError` naming it, bounded by the group's timeout (10 s here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.distributed.launch import ROOT


def test_a_rank_that_never_calls_makes_the_others_raise_a_clear_error(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "tests.distributed.missing_rank", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"the ranks took over 300 s; killed. Log tail:\n{log[-4000:]}")
    assert (tmp_path / "rank0.json").exists(), log[-4000:]
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    assert rank0["error"] == "InvalidConfigError", (rank0, log[-4000:])
    assert "not every rank of the group (2 ranks) joined" in rank0["message"]
    assert "init_process_group(timeout=...)" in rank0["message"]
