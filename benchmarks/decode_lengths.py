"""Batch sizing from remaining decode lengths (issue 41, point 5): `scheduling_policy="remaining"` against today's
"budget" policy, in one run.

Settings (all requests arrive at once; greedy, fp32, one torch thread):
  ragged   `benchmarks/throughput.py --quick`'s workload (32 prompts of 8-400 tokens, 32-96 new), Llama 256 x 4,
           a pool that holds everything (2048 blocks of 16);
  gqa6     `benchmarks/throughput.py --workload gqa6`'s (40 prompts of 16-900 tokens, 16-160 new), Llama 256 x 6 with
           2 KV heads, the same ample pool;
  tight    the ragged workload on pools of `--tight-blocks` blocks of 16 (96 and 64: about a quarter and a sixth
           of what it needs at once):
           "budget" preempts (recompute), "remaining" keeps blocks back for the running requests instead.
Each setting runs `--seeds` workload seeds; for each seed the two policies alternate `--repeats` times and the
lower process CPU time of each is kept. Reported: generated tokens per CPU second, request latency p50/p99 and TTFT
p99 in CPU seconds from the batch's start (what the request waited, on a machine that runs only this engine),
preemptions, and whether both policies produced the same tokens.

    python benchmarks/decode_lengths.py                 # 3 seeds x 2 repeats (~6 minutes on 2 busy cores)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.throughput import small_llama
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cli.workloads import ragged

POLICIES = ("budget", "remaining")


def settings(tight_blocks: list[int]):
    """name -> (model shape (layers, kv heads), workload for a seed, PagedConfig fields)."""
    quick = lambda seed: ragged(num_prompts=32, max_len=400, min_new=32, max_new=96, seed=seed)
    gqa6 = lambda seed: ragged(num_prompts=40, min_len=16, max_len=900, min_new=16, max_new=160,
                               seed=seed + 1)
    return {
        "ragged (ample pool)": ((4, 4), quick, {"num_blocks": 2048}),
        "gqa6 (ample pool)": ((6, 2), gqa6, {"num_blocks": 2048}),
        **{f"tight ({n} blocks)": ((4, 4), quick, {"num_blocks": n}) for n in tight_blocks},
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(model, work, policy: str, fields: dict, budget: int) -> dict:
    engine = Engine(model, PagedConfig(block_size=16, max_num_batched_tokens=budget, max_num_seqs=64,
                                       scheduling_policy=policy, **fields))
    engine.run([engine.add_request(work.prompts[0][:8], SamplingParams(max_new_tokens=2))])  # warm-up, untimed
    engine.reset_prefix_cache()
    before = engine.stats()
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    start = time.process_time()

    def on_step(step) -> None:
        now = time.process_time() - start
        for rid in step.new_tokens:
            first.setdefault(rid, now)
        for out in step.finished:
            done[out.request_id] = now

    ids = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(work.prompts, work.max_new_tokens)]
    outs = engine.run(ids, on_step=on_step)
    cpu = time.process_time() - start
    stats = engine.stats()
    latencies = [done[i] for i in ids]
    return {"cpu": cpu, "tokens_per_cpu_s": sum(work.max_new_tokens) / cpu,
            "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
            "ttft_p99": percentile([first[i] for i in ids], 0.99),
            "preemptions": stats["preemptions"] - before["preemptions"],
            "outputs": [outs[i].generated_tokens for i in ids]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two policies per seed")
    parser.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--tight-blocks", type=int, nargs="+", default=[96, 64])
    parser.add_argument("--only", default=None, help="run only the settings whose name starts with this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}\nblock 16, budget {args.budget} tokens, max_num_seqs 64, preemption by recompute; "
          f"{args.seeds} seeds x {args.repeats} alternations (lower CPU time of each kept)")
    rows = []
    for name, ((layers, kv_heads), workload, fields) in settings(args.tight_blocks).items():
        if args.only and not name.startswith(args.only):
            continue
        model = small_llama(1000, 256, layers, kv_heads)
        per_seed: list[dict[str, dict]] = []
        for seed in range(args.seeds):
            work = workload(seed)
            best: dict[str, dict] = {}
            for _ in range(args.repeats):
                for policy in POLICIES:
                    r = run(model, work, policy, fields, args.budget)
                    if policy not in best or r["cpu"] < best[policy]["cpu"]:
                        best[policy] = r
            per_seed.append(best)
        same = all(s["budget"]["outputs"] == s["remaining"]["outputs"] for s in per_seed)
        for policy in POLICIES:
            runs = [s[policy] for s in per_seed]
            speed = [s[policy]["tokens_per_cpu_s"] / s["budget"]["tokens_per_cpu_s"] for s in per_seed]
            p99 = [s[policy]["p99"] / s["budget"]["p99"] for s in per_seed]
            rows.append([name, policy, f"{statistics.mean(r['tokens_per_cpu_s'] for r in runs):.0f}",
                         f"{statistics.mean(speed):.2f}x ({min(speed):.2f}-{max(speed):.2f})",
                         f"{statistics.mean(r['p50'] for r in runs):.2f}", f"{statistics.mean(r['p99'] for r in runs):.2f}",
                         f"{statistics.mean(p99):.2f}x ({min(p99):.2f}-{max(p99):.2f})",
                         f"{statistics.mean(r['ttft_p99'] for r in runs):.2f}",
                         sum(r["preemptions"] for r in runs), "yes" if same else "NO"])
        print_table(["setting", "policy", "tokens / CPU s", "vs budget (seeds min-max)", "latency p50 s",
                     "latency p99 s", "p99 vs budget", "TTFT p99 s", "preemptions", "same tokens"], rows[-2:])
    print_table(["setting", "policy", "tokens / CPU s", "vs budget (seeds min-max)", "latency p50 s", "latency p99 s",
                 "p99 vs budget", "TTFT p99 s", "preemptions", "same tokens"], rows,
                title=f"\nscheduling policy (mean over {args.seeds} seeds; latencies in CPU seconds from the start)")


if __name__ == "__main__":
    main()
