"""The lean forward's in-place elementwise ops (residual adds, gate * up, RMSNorm and RoPE on their own
temporaries) against the lean forward of a git revision, interleaved in one process: CPU time of hf_paged's timed
`generate_batch` on `benchmarks/throughput.py`'s workloads, minor page faults, and whether the tokens are the same.

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/throughput_inplace_ab.py [--workload gqa6] [--old cc319b2]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import hf_paged
from benchmarks.common import machine
from benchmarks.throughput import timed_generate_batch, workload_and_model
from hf_paged.batching import lean_forward


def old_call(revision: str):
    """`LeanForward.__call__` of `revision` (its module's own helpers)."""
    source = subprocess.run(["git", "show", f"{revision}:hf_paged/batching/lean_forward.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "lean_forward_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("lean_forward_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["lean_forward_old"] = module  # (typing looks its module up)
    spec.loader.exec_module(module)
    return module.LeanForward.__call__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["default", "gqa6"], default="default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old", default="cc319b2", help="the revision whose lean forward is 'before'")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    work, model = workload_and_model(args.workload)
    params = [hf_paged.SamplingParams(max_new_tokens=w) for w in work.max_new_tokens]
    calls = {"before": old_call(args.old), "in place": lean_forward.LeanForward.__call__}

    def run(which: str) -> tuple[float, int, list]:
        lean_forward.LeanForward.__call__ = calls[which]
        try:
            def setup(engine) -> None:
                assert engine.runner.lean is not None, "no lean forward here"

            return timed_generate_batch(model, work, params, setup)
        finally:
            lean_forward.LeanForward.__call__ = calls["in place"]

    times: dict[str, list[tuple[float, int]]] = {"before": [], "in place": []}
    tokens: dict[str, list] = {}
    for r in range(args.repeats):
        for which in ("before", "in place") if r % 2 == 0 else ("in place", "before"):
            cpu, faults, tokens[which] = run(which)
            times[which].append((cpu, faults))
    before, after = times["before"], times["in place"]
    print(f"{args.workload}: before ({args.old}) {', '.join(f'{c:.2f} s ({f} faults)' for c, f in before)}; in place "
          f"{', '.join(f'{c:.2f} s ({f} faults)' for c, f in after)}; best before / best in place "
          f"{min(c for c, _ in before) / min(c for c, _ in after):.3f}; paired "
          f"{', '.join(f'{a[0] / b[0]:.3f}' for a, b in zip(before, after))}; same tokens: "
          f"{tokens['before'] == tokens['in place']}")


if __name__ == "__main__":
    main()
