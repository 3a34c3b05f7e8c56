"""The pruned last layer (`LeanForward.prune`) on and off, interleaved in one process: CPU time of hf_paged's timed
`generate_batch` on `benchmarks/throughput.py`'s workloads, and whether the tokens are the same.

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/throughput_prune_ab.py [--workload gqa6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import hf_paged
from benchmarks.common import machine
from benchmarks.throughput import timed_generate_batch, workload_and_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["default", "gqa6"], default="default")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # pruning runs with one torch thread only
    print(f"machine: {machine()}", flush=True)
    work, model = workload_and_model(args.workload)
    params = [hf_paged.SamplingParams(max_new_tokens=w) for w in work.max_new_tokens]

    def run(prune: bool) -> tuple[float, list]:
        def setup(engine) -> None:
            lean = engine.runner.lean
            assert lean is not None and (lean.prune or not prune), "the lean forward does not prune here"
            lean.prune = prune

        cpu, _, tokens = timed_generate_batch(model, work, params, setup)
        return cpu, tokens

    times: dict[bool, list[float]] = {False: [], True: []}
    tokens: dict[bool, list] = {}
    for r in range(args.repeats):
        for prune in (False, True) if r % 2 == 0 else (True, False):  # alternate which goes first
            cpu, tokens[prune] = run(prune)
            times[prune].append(cpu)
    paired = [off / on for off, on in zip(times[False], times[True])]
    print(f"{args.workload}: every row {', '.join(f'{t:.2f}' for t in times[False])} s; pruned "
          f"{', '.join(f'{t:.2f}' for t in times[True])} s; best off / best on "
          f"{min(times[False]) / min(times[True]):.3f}; paired ratios {', '.join(f'{x:.3f}' for x in paired)}; "
          f"same tokens: {tokens[False] == tokens[True]}")


if __name__ == "__main__":
    main()
