"""The CPU decode kernel at a commit (`--before`, default f44b4c0: the kernel before its prefetch) against the
working tree's, interleaved in one process: the kernel alone (ns per key of 64 decodes) and `throughput.py`'s timed
`generate_batch` (process CPU time), with the outputs compared (largest difference; tokens).

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/throughput_kernel.py [--workload gqa6] [--repeats 3]

The kernel alone: 64 decodes of 40-1250 keys (log-uniform), 8 heads, dim 32, blocks of 16, 4 layers' caches; block
ids scattered over 1,500 blocks (the pool at batch 64: far larger than the caches) or, "cached", every sequence
reading the same blocks (they stay in cache: what is left is arithmetic).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import hf_paged
from hf_paged.cache.kernels import cpu_attention

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine

KERNEL = "hf_paged/cache/kernels/cpu_attention.py"


def kernel_at(commit: str, workdir: str):
    """`cpu_attention` as it was at `commit`, compiled from that source (numba's cache off)."""
    source = subprocess.run(["git", "show", f"{commit}:{KERNEL}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.replace("cache=True", "cache=False")
    path = Path(workdir) / f"cpu_attention_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"cpu_attention_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_alone(kernels: dict, kv_heads: int, cached: bool, repeats: int) -> dict[str, tuple[float, float]]:
    """name -> (best ns per key, largest difference from the first kernel's output)."""
    heads, dim, bs, layers, n = 8, 32, 16, 4, 64
    rng = np.random.default_rng(0)
    lens = np.round(40 * (1250 / 40) ** rng.random(n)).astype(np.int32)
    ids = rng.permutation(1500).astype(np.int32)
    tables = np.zeros((n, (lens.max() + bs - 1) // bs), np.int32)
    used = 0
    for i in range(n):
        nb = (lens[i] + bs - 1) // bs
        tables[i, :nb] = ids[:nb] if cached else (ids[used:used + nb] if used + nb <= ids.size
                                                   else rng.integers(0, ids.size, nb))
        used += nb
    caches = [(rng.standard_normal((ids.size, bs, kv_heads, dim), dtype=np.float32),
               rng.standard_normal((ids.size, bs, kv_heads, dim), dtype=np.float32)) for _ in range(layers)]
    q = rng.standard_normal((n, heads, dim), dtype=np.float32)
    qsl, seqs = np.arange(n + 1, dtype=np.int32), np.arange(n, dtype=np.int32)

    def run(kernel):
        out = np.empty_like(q)
        for k, v in caches:
            kernel(q, k, v, tables, qsl, lens, seqs, np.float32(dim ** -0.5), 0, np.float32(0.0), out)
        return out

    outs = {name: run(k) for name, k in kernels.items()}  # also compiles
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for r in range(repeats):
        for name in (list(kernels) if r % 2 == 0 else list(kernels)[::-1]):
            start = time.process_time()
            run(kernels[name])
            times[name].append(time.process_time() - start)
    first = next(iter(outs.values()))
    keys = int(lens.sum()) * layers
    return {name: (min(t) / keys * 1e9, float(np.abs(outs[name] - first).max())) for name, t in times.items()}


def end_to_end(kernels: dict, workload: str, repeats: int) -> dict[str, tuple[list[float], list]]:
    from benchmarks.throughput import workload_and_model
    
    work, model = workload_and_model(workload)
    params = [hf_paged.SamplingParams(max_new_tokens=w) for w in work.max_new_tokens]
    current = cpu_attention.attend_plain
    results: dict[str, tuple[list[float], list]] = {name: ([], []) for name in kernels}
    for r in range(repeats):
        for name in (list(kernels) if r % 2 == 0 else list(kernels)[::-1]):
            cpu_attention.attend_plain = kernels[name]  # `kernel_launch` looks it up at every launch
            hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=64))
            try:
                model.generate_batch(work.prompts[:2], sampling_params=params[:2])  # warm-up, untimed
                start = time.process_time()
                out = model.generate_batch(work.prompts, sampling_params=params)
                results[name][0].append(time.process_time() - start)
                results[name][1][:] = [o.generated_tokens for o in out.values()]
            finally:
                hf_paged.unwrap(model)
                cpu_attention.attend_plain = current
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="f44b4c0", help="commit of the baseline kernel")
    parser.add_argument("--workload", choices=["default", "gqa6"], default="default")
    parser.add_argument("--repeats", type=int, default=3, help="end-to-end rounds (the kernel alone: 5x as many)")
    parser.add_argument("--skip-end-to-end", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        kernels = {f"before ({args.before})": kernel_at(args.before, workdir).attend_plain,
                   "working tree": cpu_attention.attend_plain}
        print("| kernel alone | " + " | ".join(f"{name}: ns per key" for name in kernels) + " | after / before |"
              " largest output difference |")
        print("|---|" + "---|" * (len(kernels) + 2))
        for kv_heads in (4, 2):
            for cached in (False, True):
                res = kernel_alone(kernels, kv_heads, cached, 5 * args.repeats)
                (b, _), (a, diff) = res.values()
                print(f"| {kv_heads} KV heads, {'cached' if cached else 'scattered'} | "
                      + " | ".join(f"{t:.1f}" for t, _ in res.values()) + f" | {a / b:.3f} | {diff:.1e} |")
        if args.skip_end_to_end:
            return
        res = end_to_end(kernels, args.workload, args.repeats)
    (before, tokens_b), (after, tokens_a) = res.values()
    paired = [b / a for b, a in zip(before, after)]
    print(f"\n{args.workload}: before {', '.join(f'{t:.2f}' for t in before)} s; after "
          f"{', '.join(f'{t:.2f}' for t in after)} s; best before / best after {min(before) / min(after):.3f}; "
          f"paired before/after {', '.join(f'{x:.3f}' for x in paired)}; same tokens: {tokens_b == tokens_a}")


if __name__ == "__main__":
    main()
