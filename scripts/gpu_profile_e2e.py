"""Where hf_paged's time goes on the GPU end-to-end workload (scripts/gpu_bench_e2e.py's ragged one).

    python scripts/gpu_profile_e2e.py            # ~1B random Llama, bf16, CUDA
    python scripts/gpu_profile_e2e.py --tiny     # CPU smoke test

Three timed runs on workloads of the same shape and other ids (after one warm-up): the first and the last differ
only by what the first compiled or captured; each step is timed with a device sync and split into forward and the
rest, by kind (prefill chunks in it or pure decode); then cProfile's top functions of the third run, and
torch.profiler's top kernels of a fourth.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("gpu_bench_e2e", Path(__file__).with_name("gpu_bench_e2e.py"))
e2e = importlib.util.module_from_spec(_spec)
sys.modules["gpu_bench_e2e"] = e2e  # its dataclasses look their module up
_spec.loader.exec_module(e2e)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    import hf_paged

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = e2e.TINY if args.tiny else e2e.LLAMA_1B
    model = e2e.build_model(shape, torch.float32 if args.tiny else torch.bfloat16, device)
    num, lo, hi, new = (6, 3, 40, 8) if args.tiny else (64, 32, 1024, 128)
    work = [e2e.make_workload(num, lo, hi, shape["vocab_size"], seed) for seed in range(5)]
    blocks = max(sum(-(-(len(q) + new) // 16) for q in w) for w in work)
    hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, num_blocks=int(blocks * 1.25) + 16, max_num_seqs=num,
                                              max_num_batched_tokens=64 if args.tiny else 8192))
    engine = hf_paged.engine_of(model)
    runner = engine.runner
    log: list[tuple[str, float, float]] = []  # kind, forward seconds, step seconds
    forward, step = runner.forward, engine.step
    current = {}

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed_forward(input_ids, positions, metadata, logits_rows):
        sync()
        t0 = time.perf_counter()
        out = forward(input_ids, positions, metadata, logits_rows)
        sync()
        current["forward"] = time.perf_counter() - t0
        current["kind"] = "decode" if len(input_ids) == metadata.num_seqs else "prefill+mixed"
        return out

    def timed_step(*a, **k):
        sync()
        t0 = time.perf_counter()
        out = step(*a, **k)
        sync()
        log.append((current.pop("kind", "empty"), current.pop("forward", 0.0), time.perf_counter() - t0))
        return out

    runner.forward, engine.step = timed_forward, timed_step
    e2e.run_generate_batch(model, work[0], 2)  # warm-up
    for i, w in enumerate(work[1:4], 1):
        log.clear()
        sync()
        t0 = time.perf_counter()
        if i == 3:
            prof = cProfile.Profile()
            prof.enable()
        e2e.run_generate_batch(model, w, new)
        sync()
        if i == 3:
            prof.disable()
        wall = time.perf_counter() - t0
        by_kind = defaultdict(lambda: [0, 0.0, 0.0])
        for kind, f, s in log:
            by_kind[kind][0] += 1
            by_kind[kind][1] += f
            by_kind[kind][2] += s
        steps = sum(s for _, _, s in log)
        print(f"run {i}: wall {wall:.3f} s, in steps {steps:.3f} s, outside steps {wall - steps:.3f} s")
        for kind, (n, f, s) in sorted(by_kind.items()):
            print(f"  {kind:14s} {n:4d} steps  forward {f:.3f} s  rest of step {s - f:.3f} s  "
                  f"({1e3 * s / n:.2f} ms a step)")
    stats = engine.stats()
    print("graph replays", stats["decode_graph_replays"], "captured", stats["decode_graphs_captured"])
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue()[-7000:])
    if device.type == "cuda":  # the device's side of a fourth run: which kernels take the time
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as torch_prof:
            e2e.run_generate_batch(model, work[4], new)
            sync()
        print(torch_prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    sys.exit(main())
