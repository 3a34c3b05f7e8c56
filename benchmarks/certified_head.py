"""The certified greedy head (`hf_paged/batching/certified_head.py`) against the exact fp32 head + argmax, alone.

For each head shape (vocabulary x width) and row count: CPU ms of `CertifiedArgmax.tokens` and of `_head` (the
lean forward's sliced fp32 product) + `argmax`, interleaved, the best of `--repeats` rounds; the tokens compared
(they must be equal: the proof); candidate columns per row and rows the proof left open. Rows are RMS-normed random
hidden states (a final norm's output), the heads random N(0, 0.02) like an untrained or tied embedding, so the
candidate counts are those of nearly flat logits (the hardest case for the bound: a trained model's best token
stands further out). One torch thread.

    python benchmarks/certified_head.py [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hf_paged.batching.certified_head import CertifiedArgmax, bf16_products_native
from hf_paged.batching.lean_forward import _head

SHAPES = ((32768, 64), (32000, 128), (50257, 256), (50257, 512), (151936, 896), (32000, 2048))
ROWS = (1, 4, 8, 32, 64)


def _cpu_ms(fn, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="append the markdown table to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    machine = (f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, load average "
               f"{os.getloadavg()[0]:.1f}, torch {torch.__version__} (1 thread), native bf16 products: "
               f"{bf16_products_native()}.")
    lines = [machine, "",
             "| vocab x width | rows | certified ms | exact ms | exact / certified | candidates a row | open rows |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for vocab, width in SHAPES:
        head = torch.nn.Linear(width, vocab, bias=False).requires_grad_(False)
        head.weight.normal_(0, 0.02)
        certified = CertifiedArgmax(head)
        for rows in ROWS:
            x = torch.nn.functional.rms_norm(torch.randn(rows, width), (width,))
            with torch.inference_mode():
                assert certified.tokens(x) == _head(head, x).argmax(-1).tolist(), (vocab, width, rows)
                calls = max(3, int(200 / max(1, vocab * width * rows // 10**7)))
                before = (certified.stats.candidates, certified.stats.open_rows, certified.stats.rows)
                ours, theirs = [], []
                def mine(certified=certified, x=x):
                    return certified.tokens(x)

                def exact(head=head, x=x):
                    return _head(head, x).argmax(-1).tolist()

                for _ in range(args.repeats):  # interleaved
                    ours.append(_cpu_ms(mine, calls))
                    theirs.append(_cpu_ms(exact, calls))
                n = certified.stats.rows - before[2]
                cands = (certified.stats.candidates - before[0]) / n
                opened = certified.stats.open_rows - before[1]
            lines.append(f"| {vocab} x {width} | {rows} | {min(ours):.2f} | {min(theirs):.2f} | "
                         f"{min(theirs) / min(ours):.2f}x | {cands:.1f} | {opened} of {n} |")
        print("\n".join(lines[-len(ROWS):]), flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(f"\nCommand: `python benchmarks/certified_head.py --repeats {args.repeats}`.\n\n{text}\n")


if __name__ == "__main__":
    main()
