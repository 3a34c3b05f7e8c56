"""Speculative decoding (prompt lookup) in the engine: decode tokens/s with and without it, and stock prompt lookup.

Model: `hf_paged.default_model()` (2.3M-parameter byte-level Llama). Its copy circuit was trained on copy drills
(random bytes 128-255, some stdlib text, the same bytes again): prompts whose answer copies from the prompt are
the drills' shape. Workloads, greedy, `--max-new-tokens` (default 112) tokens per request, no EOS:
  - copy: a 120-byte random string, ~200 bytes of held-out stdlib text, the string's first 8 bytes; the answer
    repeats the rest of the string (then whatever the model makes of it);
  - copy_edited ("repeat a list with changes"): the string, text, an edited copy (4 bytes changed), text, the
    edited copy's first 8 bytes: the prompt holds two sources that disagree at the edits, so lookups go wrong there;
  - code (control, no copy structure): 300 bytes of held-out stdlib code to continue; prompt lookup only pays
    where the model falls into loops;
  - code_sampled: the same, sampled at temperature 0.7 (each request seeded): few drafts hold, so this is where
    speculation stops paying.
Every request of a batch has its own string and text.

"cost" is what a speculative forward costs in plain forwards at that batch size (tokens per forward / speedup):
speculation pays while a request gains more tokens per forward than that.

Measure: decode tokens/s = tokens generated after each request's first token / process CPU time of the engine
steps after that point (prefill excluded); `torch.set_num_threads(1)`; a fresh engine per run (no prefix cache
carried over); the runs of a cell interleaved (off, on, off, on, ...) and the median of `--repeats` reported, so
slow phases of a shared machine hit every configuration alike. Greedy outputs with and without speculation are
checked identical. Stock `generate` at batch 1 (one prompt at a time): plain, and `prompt_lookup_num_tokens=k`
with the same `max_matching_ngram_size`; its decode time is time(all tokens) - time(1 token).

Usage:
    python benchmarks/speculative.py --out benchmarks/speculative_results.md
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import machine, print_table
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.api.models import default_model
from hf_paged.cli.datasets import BYTE_BOS_TOKEN_ID, stdlib_documents

WORKLOADS = ("copy", "copy_edited", "code", "code_sampled")
NOTES = """Columns: "accepted" is the share of drafted tokens kept; "tokens/forward" what a request gains per forward it
is in (1 without speculation); "cost" what one speculative forward costs in plain forwards at that batch size
(tokens/forward / speedup). Speculation pays while tokens/forward exceeds the cost: the cost grows with the batch
(from about 1.5 plain forwards at batch 1 to 5-6 at 128-512, where the forward is compute-bound), so the
break-even is set by the acceptance rate. This model's greedy outputs copy or loop (70-90% of drafts kept, 6-8
tokens a forward at k=8): no break-even up to batch 512. Sampled at temperature 0.7, 15-20% are kept (about 2
tokens a forward): it pays at batch 1 only, and k=4 beats k=8 there.
"""
TEMPERATURE = 0.7  # code_sampled


def make_prompts(workload: str, num: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(f"{workload}-{seed}")
    docs = [d.text.encode("utf-8") for d in stdlib_documents("heldout")]
    docs = [d for d in docs if len(d) > 2000]

    def text(n: int) -> bytes:
        doc = rng.choice(docs)
        start = rng.randrange(len(doc) - n)
        return doc[start : start + n]

    prompts = []
    for _ in range(num):
        string = bytes(rng.randrange(128, 256) for _ in range(120))
        if workload == "copy":
            body = string + b"\n" + text(200) + b"\n" + string[:8]
        elif workload == "copy_edited":
            edited = bytearray(string)
            for pos in rng.sample(range(16, 120), 4):
                edited[pos] = rng.randrange(128, 256)
            body = string + b"\n" + text(120) + b"\n" + bytes(edited) + b"\n" + text(80) + b"\n" + bytes(edited[:8])
        else:
            body = text(300)
        prompts.append([BYTE_BOS_TOKEN_ID, *body])
    return prompts


@dataclass(slots=True)
class Run:
    decode_cpu_s: float  # process CPU time after every request had its first token
    decode_tokens: int  # tokens generated in that time
    steps: int  # engine steps in that time
    accepted: int  # drafts kept in that time
    total_accepted: int  # drafts kept (whole run)
    drafted: int  # drafts verified (whole run)
    outputs: list[list[int]]


def engine_run(model, prompts: list[list[int]], max_new: int, k: int, max_ngram: int, sample: bool = False) -> Run:
    # room for every request's ~450 tokens (and drafts) without preemption
    engine = Engine(model, PagedConfig(block_size=16, num_blocks=32 * len(prompts) + 64, max_num_batched_tokens=8192,
                                       max_num_seqs=len(prompts), enable_prefix_caching=False))
    params = SamplingParams(max_new_tokens=max_new, eos_token_id=None, num_speculative_tokens=k,
                            prompt_lookup_max_ngram=max_ngram, do_sample=sample, temperature=TEMPERATURE)
    ids = [engine.add_request(p, params.replace(seed=i if sample else None)) for i, p in enumerate(prompts)]
    while any(not engine.requests[r].output_ids for r in ids):
        engine.step()  # prefill (several steps for the large batches: the first requests start decoding)
    first = sum(len(engine.requests[r].output_ids) for r in ids)
    accepted = sum(engine.requests[r].num_accepted_tokens for r in ids)  # early requests may have drafted already
    steps = engine.stats()["steps"]
    start = time.process_time()
    outs = engine.run(ids)
    cpu = time.process_time() - start
    total = sum(len(o.generated_tokens) for o in outs.values())
    total_accepted = sum(o.num_accepted_tokens for o in outs.values())
    return Run(cpu, total - first, engine.stats()["steps"] - steps, total_accepted - accepted, total_accepted,
               sum(o.num_draft_tokens for o in outs.values()), [outs[r].generated_tokens for r in ids])


def stock_run(model, prompt: list[int], max_new: int, k: int, max_ngram: int, sample: bool = False) -> float:
    """Decode CPU seconds of stock generate for one prompt (time for max_new tokens minus time for 1)."""
    ids = torch.tensor([prompt])
    kwargs = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": max_ngram} if k else {}
    if sample:
        kwargs.update(do_sample=True, temperature=TEMPERATURE, top_k=None)
    times = []
    for n in (1, max_new):
        start = time.process_time()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=258, **{"do_sample": False, **kwargs})
        times.append(time.process_time() - start)
    return times[1] - times[0]


def engine_acceptance(run: Run) -> float:
    return run.total_accepted / run.drafted if run.drafted else 0.0


@dataclass(slots=True)
class Cell:
    """One workload at one batch size: the engine without speculation, and with it at each k."""

    off_tok_s: float
    on_tok_s: dict[int, float]  # k -> decode tokens/s
    acceptance: dict[int, float]  # k -> share of drafts kept
    tokens_per_forward: dict[int, float]  # k -> tokens a request gains per forward it is in (1 + kept drafts)

    def speedup(self, k: int) -> float:
        return self.on_tok_s[k] / self.off_tok_s

    def cost(self, k: int) -> float:
        """A speculative forward's cost in plain forwards: it pays while a request gains more tokens a forward."""
        return self.tokens_per_forward[k] / self.speedup(k)


def bench_cell(model, workload: str, batch: int, args) -> Cell:
    prompts = make_prompts(workload, batch)
    sample = workload.endswith("_sampled")
    configs = [0, *args.ks]
    runs: dict[int, list[Run]] = {k: [] for k in configs}
    for _ in range(args.repeats):
        for k in configs:
            runs[k].append(engine_run(model, prompts, args.max_new_tokens, k, args.max_ngram, sample))
    for k in args.ks:
        if not sample and runs[k][0].outputs != runs[0][0].outputs:
            raise AssertionError(f"{workload} batch {batch} k {k}: greedy outputs differ with speculation")
    rate = {k: statistics.median(r.decode_tokens / r.decode_cpu_s for r in rs) for k, rs in runs.items()}
    first = {k: runs[k][0] for k in args.ks}
    return Cell(rate[0], {k: rate[k] for k in args.ks}, {k: engine_acceptance(r) for k, r in first.items()},
                {k: r.decode_tokens / max(r.decode_tokens - r.accepted, 1) for k, r in first.items()})


def break_even(cells: dict[int, Cell], k: int) -> str:
    """The smallest batch where speculation at `k` is not faster, or how much it still gains at the largest."""
    for batch in sorted(cells):
        if cells[batch].speedup(k) <= 1.0:
            return f"no gain from batch {batch} on ({cells[batch].speedup(k):.2f}x)"
    largest = max(cells)
    return f"still {cells[largest].speedup(k):.2f}x at batch {largest} (no break-even measured)"


def bench_stock(model, workload: str, args) -> dict:
    prompts = make_prompts(workload, args.stock_prompts)
    sample = workload.endswith("_sampled")
    plain, lookup = [], []
    for prompt in prompts:
        for _ in range(args.repeats):
            plain.append(stock_run(model, prompt, args.max_new_tokens, 0, args.max_ngram, sample))
            lookup.append(stock_run(model, prompt, args.max_new_tokens, args.k, args.max_ngram, sample))
    tokens = args.max_new_tokens - 1
    return {"plain_tok_s": tokens / statistics.median(plain), "lookup_tok_s": tokens / statistics.median(lookup)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--large-batches", default="512", help="extra batch sizes, copy workload only")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--k", default="4,8", help="num_speculative_tokens values (the last one is used for stock "
                        "prompt_lookup_num_tokens)")
    parser.add_argument("--max-ngram", type=int, default=4, help="prompt_lookup_max_ngram / max_matching_ngram_size")
    parser.add_argument("--max-new-tokens", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stock-prompts", type=int, default=3, help="prompts timed one at a time with stock generate")
    parser.add_argument("--out", default=None, help="write the tables (markdown) here")
    args = parser.parse_args()
    args.ks = [int(k) for k in args.k.split(",")]
    args.k = args.ks[-1]
    torch.set_num_threads(1)
    model, _ = default_model()
    batches = [int(b) for b in args.batches.split(",")]
    workloads = args.workloads.split(",")
    engine_run(model, make_prompts("copy", 2, seed=99), 16, args.k, args.max_ngram)  # warm-up (kernels, allocator)

    large = [int(b) for b in args.large_batches.split(",")] if args.large_batches else []
    cells: dict[str, dict[int, Cell]] = {}
    stock = {}
    for workload in workloads:
        stock[workload] = bench_stock(model, workload, args)
        cells[workload] = {}
        for batch in batches + (large if workload == "copy" else []):
            cell = cells[workload][batch] = bench_cell(model, workload, batch, args)
            print(f"{workload} batch {batch}: {cell}", flush=True)
    rows = []
    for workload, by_batch in cells.items():
        for batch, cell in by_batch.items():
            rows.append([workload, batch, f"{cell.off_tok_s:.0f}"]
                        + [f"{cell.on_tok_s[k]:.0f} ({cell.speedup(k):.2f}x)" for k in args.ks]
                        + [f"{cell.acceptance[args.k]:.0%}", f"{cell.tokens_per_forward[args.k]:.2f}",
                           f"{cell.cost(args.k):.2f}"])
    title = (f"Decode tokens/s (process CPU time, 1 torch thread), engine without / with prompt lookup "
             f"(max n-gram {args.max_ngram}), {args.max_new_tokens} new tokens a request, median of {args.repeats}:")
    table = print_table(["workload", "batch", "engine"] + [f"engine + lookup k={k}" for k in args.ks]
                        + [f"accepted (k={args.k})", f"tokens/forward (k={args.k})", f"cost (k={args.k})"], rows,
                        title)
    stock_rows = []
    for workload in workloads:
        cell = cells[workload].get(1)
        stock_rows.append([workload, f"{stock[workload]['plain_tok_s']:.0f}", f"{stock[workload]['lookup_tok_s']:.0f}",
                           f"{cell.off_tok_s:.0f}" if cell else "-",
                           f"{cell.on_tok_s[args.k]:.0f}" if cell else "-"])
    stock_table = print_table(["workload", "stock generate", f"stock prompt lookup k={args.k}", "engine",
                               f"engine + lookup k={args.k}"],
                              stock_rows, "Batch 1, decode tokens/s, side by side with stock generate:")
    verdicts = [f"- {workload}, k={k}: {break_even(by_batch, k)}" for workload, by_batch in cells.items()
                for k in args.ks]
    summary = "Where it stops paying:\n" + "\n".join(verdicts)
    print(summary)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Speculative decoding (prompt lookup) benchmark\n\n")
            f.write(f"`python benchmarks/speculative.py {' '.join(sys.argv[1:])}` on {machine()}.\n\n")
            f.write(table + "\n\n" + stock_table + "\n\n" + summary + "\n\n" + NOTES)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
