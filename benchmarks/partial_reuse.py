"""Reuse past the last full block (issue 41, point 6), on vs off, side by side in one run.

With it, a prompt that shares part of a cached block (a system prompt that ends mid-block, then a question; a
chat's next turn, whose history ends in the last turn's cached partial block) copies those tokens' K/V into its own
block instead of recomputing them; off, only whole blocks are reused. Workloads
(`hf_paged.cli.workloads`), each over 3 seeds, on and off interleaved per seed:
  (a) shared 1000-token prefix + 64 questions (prefix ends 8 tokens into a 16-token block)
  (b) shared 700-token prefix + 64 questions (ends 12 tokens in)
  (c) 8-shot prompts, examples of 60 tokens (480 tokens: a whole number of blocks, so nothing to gain)
  (d) multi-turn chat, 8 users x 4 turns (a turn's prompt is the last one plus its answer plus a message)
Reports the prefix hit rate, prompt tokens computed, CPU seconds (one torch thread) and whether the greedy outputs
are identical.

    python benchmarks/partial_reuse.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.prefix import run_batch
from benchmarks.throughput import small_llama
from hf_paged import Engine, PagedConfig
from hf_paged.cli.workloads import few_shot, multi_turn, next_turn, shared_prefix


def measure(model, workload, partial: bool) -> dict:
    engine = Engine(model, PagedConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=64))
    engine.kv.partial_reuse = partial
    start = time.process_time()
    prompts, news = workload.prompts, workload.max_new_tokens
    outs, _ = run_batch(engine, prompts, news)
    outputs = [o.generated_tokens for o in outs]
    for turn in range(len(workload.messages[0]) if workload.messages else 0):
        prompts = [next_turn(p, o.generated_tokens, m[turn]) for p, o, m in zip(prompts, outs, workload.messages)]
        outs, _ = run_batch(engine, prompts, news)
        outputs += [o.generated_tokens for o in outs]
    seconds = time.process_time() - start
    stats = engine.stats()
    return {"cpu": seconds, "hit": stats["prompt_tokens_cached"] / stats["prompt_tokens"],
            "computed": stats["prompt_tokens"] - stats["prompt_tokens_cached"], "outputs": outputs}


def main() -> None:
    torch.set_num_threads(1)
    model = small_llama(1000, 256, 4)
    workloads = {
        "(a) shared 1000-token prefix": lambda seed: shared_prefix(64, 1000, max_new=16, seed=seed),
        "(b) shared 700-token prefix": lambda seed: shared_prefix(64, 700, max_new=16, seed=seed),
        "(c) 8-shot": lambda seed: few_shot(32, seed=seed),
        "(d) multi-turn 8x4": lambda seed: multi_turn(8, 4, max_new=16, seed=seed),
    }
    print(f"machine: {machine()}; torch {torch.__version__}, one thread\nmodel: random Llama hidden 256 x 4 layers, "
          "fp32; block_size 16, budget 512; 3 seeds, on/off interleaved")
    rows = []
    for name, make in workloads.items():
        runs = {False: [], True: []}
        for seed in range(3):
            work = make(seed)
            for partial in (False, True):
                runs[partial].append(measure(model, work, partial))
        same = all(a["outputs"] == b["outputs"] for a, b in zip(runs[False], runs[True]))
        for partial in (False, True):
            r = runs[partial]
            cpu = [x["cpu"] for x in r]
            ratio = [off["cpu"] / on["cpu"] for off, on in zip(runs[False], r)]
            rows.append([name, "on" if partial else "off", f"{sum(x['hit'] for x in r) / 3:.2%}",
                         f"{sum(x['computed'] for x in r) / 3:.0f}", f"{sum(cpu) / 3:.2f} ({min(cpu):.2f}-{max(cpu):.2f})",
                         f"{sum(ratio) / 3:.2f}x ({min(ratio):.2f}-{max(ratio):.2f})", "yes" if same else "NO"])
    print_table(["workload", "partial reuse", "hit rate", "prompt tokens computed", "CPU s (min-max)",
                 "speed vs off (min-max)", "same outputs"], rows, title="\nreuse past the last full block")


if __name__ == "__main__":
    main()
