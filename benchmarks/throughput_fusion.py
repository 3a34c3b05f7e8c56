"""Would fusing q/k/v (and gate/up) into one matmul pay on the CPU? Split vs fused `mm`, CPU time, one thread.

The shapes of `benchmarks/throughput.py`'s models (hidden 256, intermediate 704, 8 heads of 32, 4 or 2 KV heads),
at row counts a step of budget 512 runs (1: one decode; 16-64: decode batches; 512: a full prefill step).
Interleaved, best of `--repeats` rounds. Also reports whether the fused product's columns are bit for bit the split
products (the condition `LeanForward` would need).

    python benchmarks/throughput_fusion.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine


def best_us(fn, reps: int) -> float:
    start = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - start) / reps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    torch.manual_seed(0)
    groups = {"q/k/v, 4 KV heads": (256, [256, 128, 128]), "q/k/v, 2 KV heads": (256, [256, 64, 64]),
              "gate/up": (256, [704, 704])}
    print("| weights | rows | split us | fused us | fused / split | fused columns equal split |")
    print("|---|---|---|---|---|---|")
    for name, (k, outs) in groups.items():
        weights = [torch.randn(n, k) for n in outs]
        fused_w = torch.cat(weights)
        for rows in (1, 16, 48, 64, 512):
            x = torch.randn(rows, k)
            reps = max(20, 20000 // rows)

            def split(x=x, weights=weights):
                return [torch.mm(x, w.t()) for w in weights]

            def fused(x=x, fused_w=fused_w):
                return torch.mm(x, fused_w.t())

            times = {"split": [], "fused": []}
            for _ in range(args.repeats):
                times["split"].append(best_us(split, reps))
                times["fused"].append(best_us(fused, reps))
            s, f = min(times["split"]), min(times["fused"])
            equal = torch.equal(torch.cat(split(), dim=1), fused())
            print(f"| {name} | {rows} | {s:.1f} | {f:.1f} | {f / s:.3f} | {equal} |")


if __name__ == "__main__":
    main()
