"""Throughput of continuous batching on a ragged workload, side by side in one run.

Compares, on a small random Llama (fp32, CPU by default), greedy decoding of the same requests with:
  1. wrapped `generate_batch` (hf_paged engine: packed ragged batches, chunked prefill, per-request lengths);
  2. stock `generate` on the whole batch, left-padded;
  3. stock `generate` in left-padded batches of 8 (prompts in input order, and sorted by length: less padding);
  4. transformers' built-in `generate_batch` (explicit small cache config: its default sizing takes minutes on CPU).
Each request wants its own number of new tokens (64-256 by default). Stock `generate` and transformers'
`generate_batch` take one `max_new_tokens` per call, so they run to the batch's largest and the surplus is cut:
tokens/s counts only the tokens each request asked for (the same useful work for every method).
The hf_paged outputs are checked token for token against stock `generate` on each prompt.

Timed by process CPU time (all threads of the process) on one torch thread by default, best of `--repeats` with
the methods interleaved; wall seconds are printed beside it.

    python benchmarks/throughput.py            # the full workload (several minutes on 2 CPU cores)
    python benchmarks/throughput.py --quick --repeats 2    # a smaller one
    python benchmarks/throughput.py --workload gqa6        # 40 prompts of 16-900 tokens, a 6-layer GQA Llama
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import hf_paged
from benchmarks.common import machine, print_table
from hf_paged.cli.workloads import left_pad, ragged


def small_llama(vocab: int, hidden: int, layers: int, kv_heads: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=kv_heads,
                         max_position_embeddings=2048, eos_token_id=None, bos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@torch.inference_mode()
def stock_batches(model, prompts, wants, batch_size, by_length: bool = False):
    """Stock `generate` in left-padded batches of `batch_size`, in input order or, with `by_length`, with prompts
    sorted by length first (the usual trick to cut padding); outputs in input order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i])) if by_length else list(range(len(prompts)))
    outs: list = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ids, mask = left_pad([prompts[i] for i in chunk])
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max(wants[i] for i in chunk))
        for row, i in enumerate(chunk):
            outs[i] = out[row, ids.shape[1]:ids.shape[1] + wants[i]].tolist()
    return outs


def hf_generate_batch(model, prompts, wants, budget):
    from transformers import ContinuousBatchingConfig

    cb = ContinuousBatchingConfig(num_blocks=sum(len(p) + max(wants) for p in prompts) // 32 + 64,
                                  max_batch_tokens=budget, page_size=32)
    res = model.generate_batch(prompts, GenerationConfig(max_new_tokens=max(wants), do_sample=False,
                                                         eos_token_id=None, pad_token_id=0),
                               continuous_batching_config=cb)
    return [res[f"req_{i}"].generated_tokens[:w] for i, w in enumerate(wants)]


def timed(fn) -> tuple[float, float, object]:
    """(process CPU seconds, wall seconds, result) of one call (CPU time: every thread of this process)."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - cpu, time.perf_counter() - wall, out


def workload(name: str):
    """The ragged workload `name` ("default" or "gqa6") and its model's (layers, KV heads), as `main` runs them."""
    if name == "gqa6":  # a workload the defaults were not tuned on: other lengths, depth, GQA ratio
        return ragged(num_prompts=40, min_len=16, max_len=900, min_new=16, max_new=160, seed=1), 6, 2
    return ragged(num_prompts=64, max_len=1000, min_new=64, max_new=256, seed=0), 4, 4


def workload_and_model(name: str):
    """`workload(name)`'s prompts and a fresh random model of its shape (hidden 256): what the A/B scripts time."""
    work, layers, kv_heads = workload(name)
    return work, small_llama(1000, 256, layers, kv_heads)


def timed_generate_batch(model, work, params, setup=None) -> tuple[float, int, list]:
    """What the A/B scripts time: `model` wrapped (blocks of 16, budget 512, 64 sequences), `setup(engine)` if given,
    a 2-prompt warm-up, then `generate_batch` over `work`'s prompts: (CPU s, minor page faults, tokens); unwrapped
    after."""
    hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=64))
    try:
        if setup is not None:
            setup(hf_paged.engine_of(model))
        model.generate_batch(work.prompts[:2], sampling_params=params[:2])  # warm-up, untimed
        faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        out = model.generate_batch(work.prompts, sampling_params=params)
        return (time.process_time() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                [o.generated_tokens for o in out.values()])
    finally:
        hf_paged.unwrap(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 prompts of 8-400 tokens, 32-96 new tokens")
    parser.add_argument("--workload", choices=["default", "gqa6"], default="default",
                        help="gqa6: 40 prompts of 16-900 tokens, 16-160 new, a 6-layer Llama with 2 KV heads")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--budget", type=int, default=512, help="hf_paged max_num_batched_tokens")
    parser.add_argument("--skip-hf", action="store_true", help="skip transformers' generate_batch")
    parser.add_argument("--only-ours", action="store_true",
                        help="run hf_paged only (for a profiler: `py-spy record --native -- python ... --only-ours`)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: several threads of small matmuls swing 2x on a shared machine)")
    parser.add_argument("--repeats", type=int, default=1, help="best of N by process CPU time, methods interleaved")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kv_heads = 4
    if args.quick:
        work = ragged(num_prompts=32, max_len=400, min_new=32, max_new=96, seed=0)
    elif args.workload == "gqa6":
        work, args.layers, kv_heads = workload("gqa6")
    else:
        work = workload("default")[0]
    prompts, wants = work.prompts, work.max_new_tokens
    useful = sum(wants)
    model = small_llama(1000, args.hidden, args.layers, kv_heads)
    print(f"machine: {machine()}")
    print(f"workload: {len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens "
          f"({min(map(len, prompts))}-{max(map(len, prompts))}), {useful} new tokens wanted "
          f"({min(wants)}-{max(wants)}); model: Llama hidden {args.hidden} x {args.layers} layers, 8 heads / "
          f"{kv_heads} KV heads, fp32")

    def ours():
        hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, max_num_batched_tokens=args.budget, max_num_seqs=64))
        try:
            params = [hf_paged.SamplingParams(max_new_tokens=w) for w in wants]
            model.generate_batch(prompts[:2], sampling_params=params[:2])  # warm-up (allocates the pool), untimed
            out = timed(lambda: model.generate_batch(prompts, sampling_params=params))
            stats.update(hf_paged.engine_of(model).stats())
        finally:
            hf_paged.unwrap(model)
        return out[0], out[1], [o.generated_tokens for o in out[2].values()]

    stats: dict = {}
    methods = {"hf_paged generate_batch": ours,
               "stock generate, whole batch padded": lambda: timed(lambda: stock_batches(model, prompts, wants,
                                                                                          len(prompts))),
               "stock generate, batches of 8": lambda: timed(lambda: stock_batches(model, prompts, wants, 8)),
               "stock generate, batches of 8 sorted by length": lambda: timed(
                   lambda: stock_batches(model, prompts, wants, 8, by_length=True))}
    if args.only_ours:
        methods = {"hf_paged generate_batch": ours}
    elif not args.skip_hf:
        methods["transformers generate_batch"] = lambda: timed(lambda: hf_generate_batch(model, prompts, wants,
                                                                                         args.budget))
    results: dict[str, tuple[float, float, list]] = {}
    for _ in range(args.repeats):
        for name, run in methods.items():  # interleaved: every method sees the same machine
            cpu, wall, outs = run()
            if name not in results or cpu < results[name][0]:
                results[name] = (cpu, wall, outs)

    reference = results.get("stock generate, batches of 8", (0, 0, None))[2]  # None with --only-ours
    base = results["hf_paged generate_batch"][0]
    rows = []
    for name, (cpu, wall, outs) in results.items():
        same = "not run" if reference is None else f"{sum(a == b for a, b in zip(outs, reference))}/{len(prompts)}"
        rows.append([name, f"{cpu:.2f}", f"{wall:.2f}", f"{useful / cpu:.0f}", f"{cpu / base:.2f}x", same])
    print_table(["method", "CPU seconds", "wall seconds", "tokens per CPU second", "hf_paged speed-up (CPU)",
                 "same tokens as stock (batches of 8)"], rows,
                title=f"\nthroughput (greedy, fp32, {args.threads} torch thread(s), best of {args.repeats} by process "
                      "CPU time)")
    print(f"\nhf_paged engine: {stats['steps']} steps, {stats['tokens_per_step']:.0f} tokens/step, "
          f"batch utilisation {stats['batch_utilization']:.0%}, peak KV blocks {stats['peak_blocks_used']}"
          f"/{stats['blocks_total']}, preemptions {stats['preemptions']}")


if __name__ == "__main__":
    main()
