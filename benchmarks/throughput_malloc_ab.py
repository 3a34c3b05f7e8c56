"""glibc's malloc keeping freed memory (`mallopt`: mmap threshold 32 MB, trim threshold 64 MB, set before anything
runs) or left as it is, in alternating fresh processes (the setting is process-wide and cannot be undone in one):
CPU time and minor page faults of one timed call on
`benchmarks/throughput.py`'s workloads, hf_paged's `generate_batch` and (with `--stock`) stock `generate` in
batches of 8 sorted by length, run after hf_paged in the same process (as in `throughput.py`), and whether the
tokens are the same.

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/throughput_malloc_ab.py [--workload gqa6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine


def measured(fn) -> tuple[float, int, object]:
    faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    out = fn()
    return time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, out


def keep_freed_memory() -> None:
    """Fixed thresholds (by default both follow the largest block freed so far, and a step's temporaries went back
    to the kernel at its end, to be faulted in again page by page in the next step)."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    assert libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 64 << 20)


def child(workload: str, stock: bool, keep: bool) -> None:
    if keep:
        keep_freed_memory()
    import torch

    import hf_paged
    from benchmarks.throughput import stock_batches, workload_and_model

    torch.set_num_threads(1)
    work, model = workload_and_model(workload)
    params = [hf_paged.SamplingParams(max_new_tokens=w) for w in work.max_new_tokens]
    hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=64))
    model.generate_batch(work.prompts[:2], sampling_params=params[:2])  # warm-up, untimed
    cpu, faults, out = measured(lambda: model.generate_batch(work.prompts, sampling_params=params))
    hf_paged.unwrap(model)
    result = {"ours": [cpu, faults], "tokens": [o.generated_tokens for o in out.values()]}
    if stock:
        cpu, faults, _ = measured(lambda: stock_batches(model, work.prompts, work.max_new_tokens, 8, by_length=True))
        result["stock"] = [cpu, faults]
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["default", "gqa6"], default="default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stock", action="store_true", help="also stock generate, sorted batches of 8")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.workload, args.stock, args.keep)
    print(f"machine: {machine()}", flush=True)
    runs: dict[str, list[dict]] = {"0": [], "1": []}
    for r in range(args.repeats):
        for keep in ("0", "1") if r % 2 == 0 else ("1", "0"):  # alternate which goes first
            cmd = [sys.executable, __file__, "--child", "--workload", args.workload] + ["--stock"] * args.stock
            cmd += ["--keep"] * (keep == "1")
            runs[keep].append(json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                                        text=True).stdout.strip().splitlines()[-1]))
    for side in ("ours", "stock") if args.stock else ("ours",):
        off, on = ([run[side] for run in runs[k]] for k in ("0", "1"))
        print(f"{args.workload} {side}: malloc as is {', '.join(f'{c:.2f} s ({f} faults)' for c, f in off)}; "
              f"keeping freed memory {', '.join(f'{c:.2f} s ({f} faults)' for c, f in on)}; best off / best on "
              f"{min(c for c, _ in off) / min(c for c, _ in on):.3f}; paired "
              f"{', '.join(f'{a[0] / b[0]:.3f}' for a, b in zip(off, on))}")
    print(f"same tokens: {all(run['tokens'] == runs['0'][0]['tokens'] for k in runs for run in runs[k])}")


if __name__ == "__main__":
    main()
