"""The engine's attention path on the CPU, side by side in one run: in-place kernels vs the torch gather path.

    python benchmarks/attention_path.py [--requests 48] [--repeats 2]

A random Llama of ~60M parameters (hidden 512 x 8 layers, 8 heads, 4 KV heads, vocabulary 32k), fp32, one torch
thread; 48 ragged requests (prompts 8-1000 tokens log-uniform, 16-64 new tokens), greedy, default `PagedConfig` but
for the two knobs compared:
  - `attention_backend`: "auto" (the numba kernels reading the pool in place, `kernels/cpu_attention`) or "torch"
    (every layer gathers each sequence's blocks into a fresh tensor, zero-fills the padding, then SDPA; a quantized
    cache is first dequantized whole into a read buffer);
  - `kv_cache_dtype`: auto (fp32 blocks), int8, int4.
Each configuration runs the same requests on a fresh engine (after one warm-up request), in rotation, best of
`--repeats` by process CPU time. Per run, thread CPU time is split by probes: the whole attention call of a layer
(the step's backend, `TorchBackend.forward`: the K/V store included), the arithmetic inside it (the kernels'
calls, and SDPA on the torch path), and the rest of the step. "Attention overhead" is attention minus its arithmetic: gathers, fills, casts, plans,
dequantizing into buffers, argument marshalling. Outputs are compared across configurations (greedy tokens).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import hf_paged  # noqa: E402
from benchmarks.common import machine, print_table  # noqa: E402
from hf_paged.cli.workloads import ragged  # noqa: E402

CONFIGS = [("auto", "auto"), ("torch", "auto"), ("auto", "int8"), ("torch", "int8"), ("auto", "int4"),
           ("torch", "int4")]


def build_model() -> torch.nn.Module:
    """The random 60M Llama of `latency.py --arrivals` (and of the issue's profile)."""
    from benchmarks.latency import stall_model

    return stall_model()


@contextmanager
def probes(totals: dict[str, float]):
    """Add thread CPU time of the attention function, its arithmetic and the engine step to `totals`."""
    import hf_paged.cache.kernels.cpu_attention as kernels
    import hf_paged.cache.kernels.cpu_quantized as quantized_kernels
    import hf_paged.cache.kernels.reference as reference
    import hf_paged.cache.kernels.reference_quantized as reference_quantized
    from hf_paged.batching.engine import Engine
    from hf_paged.cache.attention_backends import TorchBackend

    def timed(label, fn):
        def call(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label] += time.thread_time() - start
        return call

    sdpa = torch.nn.functional.scaled_dot_product_attention
    patches = [(kernels, "attend_plain"), (kernels, "attend_plain_parallel"), (quantized_kernels, "attend_quantized"),
               (quantized_kernels, "attend_quantized_parallel")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in patches]
    for owner, name in patches:
        setattr(owner, name, timed("arithmetic", getattr(owner, name)))
    timed_sdpa = timed("arithmetic", sdpa)
    reference.F.scaled_dot_product_attention = timed_sdpa  # the torch path's module-level `F`
    reference_quantized.F.scaled_dot_product_attention = timed_sdpa
    forward = TorchBackend.forward  # every backend's per-layer call (stock attention modules and the lean forward)
    TorchBackend.forward = timed("attention", forward)
    step = Engine.step
    Engine.step = timed("step", step)
    try:
        yield
    finally:
        Engine.step = step
        TorchBackend.forward = forward
        torch.nn.functional.scaled_dot_product_attention = sdpa
        for owner, name, original in saved:
            setattr(owner, name, original)


def run(model, backend: str, kv_dtype: str, prompts, wants) -> dict:
    engine = hf_paged.Engine(model, hf_paged.PagedConfig(attention_backend=backend, kv_cache_dtype=kv_dtype))
    engine.run([engine.add_request(list(range(3, 40)), hf_paged.SamplingParams(max_new_tokens=4))])  # warm-up
    totals: dict[str, float] = defaultdict(float)
    start = time.process_time()
    with probes(totals):
        rids = [engine.add_request(p, hf_paged.SamplingParams(max_new_tokens=w)) for p, w in zip(prompts, wants)]
        outs = engine.run(rids)
    seconds = time.process_time() - start
    tokens = [outs[r].generated_tokens for r in rids]
    return {"seconds": seconds, "tokens": tokens, "steps": engine.stats()["steps"] - 4, **totals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=[f"{b}/{d}" for b, d in CONFIGS],
                        help="backend/kv_cache_dtype pairs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    work = ragged(num_prompts=args.requests, min_len=8, max_len=1000, min_new=16, max_new=64, vocab=(3, 32000),
                  seed=0)
    prompts, wants = work.prompts, work.max_new_tokens
    model = build_model()
    configs = [tuple(c.split("/")) for c in args.configs]
    best: dict[tuple, dict] = {}
    for _ in range(args.repeats):
        for config in configs:  # interleaved: every configuration sees the same machine
            result = run(model, *config, prompts, wants)
            if config not in best or result["seconds"] < best[config]["seconds"]:
                best[config] = result
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"workload: {len(prompts)} requests, {sum(map(len, prompts))} prompt tokens "
          f"({min(map(len, prompts))}-{max(map(len, prompts))}), {sum(wants)} new tokens; Llama 512 x 8, fp32, "
          f"1 thread, best of {args.repeats} by process CPU time")
    base = best.get(("auto", "auto"))
    rows = []
    for (backend, kv_dtype), r in best.items():
        overhead = r["attention"] - r["arithmetic"]
        same = "-" if base is None else f"{sum(a == b for a, b in zip(r['tokens'], base['tokens']))}/{len(prompts)}"
        rows.append([backend, kv_dtype, f"{sum(wants) / r['seconds']:.1f}",
                     f"{base['seconds'] / r['seconds']:.2f}x" if base else "-",
                     f"{1000 * r['step'] / r['steps']:.1f}", f"{100 * r['attention'] / r['step']:.1f}%",
                     f"{100 * r['arithmetic'] / r['step']:.1f}%", f"{100 * overhead / r['step']:.1f}%", same])
    print_table(["backend", "kv_cache_dtype", "tokens/s", "vs auto/auto", "ms per step", "attention",
                 "its arithmetic", "attention overhead", "same tokens as auto/auto"], rows,
                title="\nattention path (shares of step time, thread CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
