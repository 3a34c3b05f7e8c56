"""What a quantized KV cache costs in speed on the CPU: `generate_batch` over `throughput.py`'s ragged workload with
`kv_cache_dtype` "auto" (fp32 blocks), "int8", "int4" and "fp8", interleaved in one process, best of `--repeats` by
process CPU time; the ratio to "auto" measured in the same run.

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/kv_dtype_speed.py [--workload gqa6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_paged
from benchmarks import throughput
from benchmarks.common import machine

DTYPES = ("auto", "int8", "int4", "fp8")


def timed_run(model, work, params, dtype: str) -> tuple[float, int]:
    """(CPU seconds, tokens generated) of one `generate_batch` over the workload, a 2-prompt warm-up untimed."""
    hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=64,
                                              kv_cache_dtype=dtype))
    try:
        model.generate_batch(work.prompts[:2], sampling_params=params[:2])
        start = time.process_time()
        out = model.generate_batch(work.prompts, sampling_params=params)
        return time.process_time() - start, sum(len(o.generated_tokens) for o in out.values())
    finally:
        hf_paged.unwrap(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["default", "gqa6"], default="default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work, model = throughput.workload_and_model(args.workload)
    params = [hf_paged.SamplingParams(max_new_tokens=n) for n in work.max_new_tokens]
    print(f"machine: {machine()}")
    print(f"workload {args.workload}: {len(work.prompts)} prompts, {sum(map(len, work.prompts))} prompt tokens, "
          f"{sum(work.max_new_tokens)} new tokens wanted; best of {args.repeats}, dtypes interleaved")
    best: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for _ in range(args.repeats):
        for dtype in args.dtypes:
            cpu, tokens[dtype] = timed_run(model, work, params, dtype)
            best[dtype] = min(best.get(dtype, float("inf")), cpu)
    base = best.get("auto")
    print("| kv_cache_dtype | CPU s (best) | tokens | vs auto |")
    print("|---|---:|---:|---:|")
    for dtype in args.dtypes:
        ratio = f"{best[dtype] / base:.2f}x" if base else "-"
        print(f"| {dtype} | {best[dtype]:.2f} | {tokens[dtype]} | {ratio} |")


if __name__ == "__main__":
    main()
