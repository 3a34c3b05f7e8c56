"""Prefix caching on vs off, side by side in one run, on three workloads (small random Llama, fp32, CPU):

  (a) shared system prompt of ~1000 tokens followed by 64 different questions;
  (b) 8-shot prompts sharing their examples (32 queries);
  (c) multi-turn chat: 8 users x 4 turns (turn t's prompt = turn t-1's prompt + answer + a new message).

Reports tokens/s (prompt + generated tokens processed per second of wall time), TTFT p50, hit rate (prompt
tokens served from cache / prompt tokens) and prompt tokens actually computed. For (c), the hit rate of turns
after the first is reported separately.

    python benchmarks/prefix.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table  # noqa: E402
from benchmarks.throughput import small_llama  # noqa: E402
from hf_paged import Engine, PagedConfig, SamplingParams  # noqa: E402
from hf_paged.cli.workloads import few_shot, multi_turn, next_turn, shared_prefix  # noqa: E402


def run_batch(engine: Engine, prompts, max_new) -> tuple[list, float]:
    start = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, max_new)]
    outs = engine.run(ids)
    return [outs[i] for i in ids], time.perf_counter() - start


def measure(model, workload, caching: bool, budget: int) -> dict:
    engine = Engine(model, PagedConfig(block_size=16, max_num_batched_tokens=budget, max_num_seqs=64,
                                       enable_prefix_caching=caching))
    prompts, news = workload.prompts, workload.max_new_tokens
    outs, seconds = run_batch(engine, prompts, news)
    later_prompt = later_cached = 0
    for turn in range(len(workload.messages[0]) if workload.messages else 0):
        before = engine.stats()
        prompts = [next_turn(p, o.generated_tokens, m[turn]) for p, o, m in zip(prompts, outs, workload.messages)]
        outs, more = run_batch(engine, prompts, news)
        seconds += more
        after = engine.stats()
        later_prompt += after["prompt_tokens"] - before["prompt_tokens"]
        later_cached += after["prompt_tokens_cached"] - before["prompt_tokens_cached"]
    stats = engine.stats()
    processed = stats["prompt_tokens"] + stats["generated_tokens"]
    return {
        "seconds": seconds, "tokens_per_s": processed / seconds, "ttft_p50_s": stats["ttft_p50_s"],
        "hit_rate": stats["prefix_hit_rate"], "computed_prompt": stats["prompt_tokens"] - stats["prompt_tokens_cached"],
        "later_turns_hit_rate": later_cached / later_prompt if later_prompt else None,
        "outputs": [o.generated_tokens for o in outs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    scale = 2 if args.quick else 1
    model = small_llama(1000, 256, 4)
    workloads = [
        ("(a) shared 1000-token prefix", shared_prefix(num_questions=64 // scale, prefix_len=1000, max_new=16)),
        ("(b) 8-shot", few_shot(num_queries=32 // scale)),
        ("(c) multi-turn 8x4", multi_turn(num_users=8, num_turns=4 // scale, max_new=16)),
    ]
    print(f"machine: {machine()}\nmodel: random Llama hidden 256 x 4 layers, fp32; block_size 16, budget 512")
    rows = []
    for name, work in workloads:
        off = measure(model, work, False, 512)
        on = measure(model, work, True, 512)
        same = "yes" if on["outputs"] == off["outputs"] else "NO"
        for label, r in (("off", off), ("on", on)):
            rows.append([name, label, f"{r['seconds']:.2f}", f"{r['tokens_per_s']:.0f}",
                         f"{r['tokens_per_s'] / off['tokens_per_s']:.2f}x", f"{(r['ttft_p50_s'] or 0) * 1000:.0f}",
                         f"{r['hit_rate']:.1%}", r["computed_prompt"],
                         "-" if r["later_turns_hit_rate"] is None else f"{r['later_turns_hit_rate']:.1%}", same])
    print_table(["workload", "caching", "seconds", "tokens/s", "vs off", "TTFT p50 ms", "hit rate",
                 "prompt tokens computed", "hit rate turns 2+", "same outputs"], rows, title="\nprefix caching")


if __name__ == "__main__":
    main()
