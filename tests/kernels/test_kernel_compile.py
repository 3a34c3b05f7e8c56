"""The kernels compile for real GPUs (sm_90, sm_80) at real model shapes, without spills: checked on a CPU.

The interpreter never compiles. `scripts/gpu_compile_check.py` builds the launches exactly as the launchers do and
compiles them with Triton's NVIDIA backend (bundled ptxas); it needs no GPU and no driver.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _nvidia_tools_present() -> bool:
    try:
        import triton
    except ImportError:
        return False
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return (tools / "ptxas").exists() and (tools / "cuobjdump").exists()


@pytest.mark.skipif(not _nvidia_tools_present(), reason="triton without its NVIDIA backend tools (ptxas, cuobjdump)")
def test_kernels_compile_for_sm90_and_sm80_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compile for real, not from an earlier run's cache
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    report = tmp_path / "compile.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_compile_check.py"), "--quick", "--json", str(report)],
        check=False, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(report.read_text())
    compiled = {(r["kernel"], r["capability"]) for r in results if r["ok"]}
    # the int4 decode scenario compiles both kernels: the joined tiles and the split nibbles (triton_int4)
    kernels = ["_decode_kernel", "_decode_split_kernel", "_merge_kernel", "_prefill_kernel", "_store_kernel"]
    for kernel in kernels:
        assert {(kernel, 90), (kernel, 80)} <= compiled
    assert all(r["spill_bytes"] == 0 and 0 < r["registers"] <= 255 for r in results)
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
