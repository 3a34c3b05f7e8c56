"""Causal prefill chunks in row blocks (`causal_rows.CAUSAL_ROW_BLOCK`) on and off, interleaved in one process: CPU
time of hf_paged's timed `generate_batch` on `benchmarks/throughput.py`'s workloads, and whether the tokens are
the same. Off is one SDPA call per chunk (0), as before.

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/throughput_causal_ab.py [--workload gqa6] [--repeats 3]
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
from hf_paged.cache.kernels import causal_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["default", "gqa6"], default="default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=causal_rows.CAUSAL_ROW_BLOCK, help="the row block when on")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    work, model = workload_and_model(args.workload)
    params = [hf_paged.SamplingParams(max_new_tokens=w) for w in work.max_new_tokens]

    def run(rows: int) -> tuple[float, list]:
        causal_rows.CAUSAL_ROW_BLOCK = rows
        cpu, _, tokens = timed_generate_batch(model, work, params)
        return cpu, tokens

    times: dict[int, list[float]] = {0: [], args.rows: []}
    tokens: dict[int, list] = {}
    for r in range(args.repeats):
        for rows in (0, args.rows) if r % 2 == 0 else (args.rows, 0):  # alternate which goes first
            cpu, tokens[rows] = run(rows)
            times[rows].append(cpu)
    paired = [off / on for off, on in zip(times[0], times[args.rows])]
    print(f"{args.workload}: one call per chunk {', '.join(f'{t:.2f}' for t in times[0])} s; rows of {args.rows} "
          f"{', '.join(f'{t:.2f}' for t in times[args.rows])} s; best off / best on "
          f"{min(times[0]) / min(times[args.rows]):.3f}; paired ratios {', '.join(f'{x:.3f}' for x in paired)}; "
          f"same tokens: {tokens[0] == tokens[args.rows]}")


if __name__ == "__main__":
    main()
