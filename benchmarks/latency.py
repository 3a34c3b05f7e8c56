"""Small-batch latency: the wrapped `generate` against stock `generate`, and where an engine step's time goes.

    python benchmarks/latency.py [--repeats 3] [--prompt-len 200] [--new-tokens 96] [--models llama qwen2 tiny-lm]

Part 1, side by side: each model generates `--new-tokens` greedy tokens after a `--prompt-len`-token prompt, at
batch 1 (cold: prefix cache emptied first; hit: the same prompt again) and batch 4 (four different prompts in one
`generate` call: all of `--prompt-len` tokens, so stock pads nothing; and ragged, 1/4 to 4/4 of it, left-padded). Stock `generate` and the wrapped one run interleaved, best
of `--repeats`, in process CPU time with one torch thread (the engine's loop thread is counted: it is the same
process). Outputs are checked equal.

Part 2, per decode step at batch 1, 4 and 32 (the engine driven directly, so all its work is in this thread): the
step's thread CPU time split into the forward (with, inside it, the attention plan, the K/V store and the attention
itself) and the engine's own work outside it (weights check, scheduling, step inputs, sampler and processors,
prefix-cache bookkeeping). Only decode-only steps are counted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hf_paged  # noqa: E402
from benchmarks.common import machine  # noqa: E402
from hf_paged import Engine, PagedConfig, SamplingParams  # noqa: E402
from hf_paged.cli.workloads import left_pad  # noqa: E402

VOCAB = 1000


def build_model(name: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if name == "tiny-lm":
        return hf_paged.default_model().model
    torch.manual_seed(0)
    shape = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=4, max_position_embeddings=2048)
    model = (LlamaForCausalLM(LlamaConfig(**shape)) if name == "llama" else Qwen2ForCausalLM(Qwen2Config(**shape)))
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def prompts(model, batch: int, length: int, seed: int) -> torch.Tensor:
    vocab = min(model.config.vocab_size, 256)  # the embedded model's ids past 255 are special tokens
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=g)


# -- part 1: side by side ---------------------------------------------------------------------------------------
def timed(fn) -> tuple[float, torch.Tensor]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def compare(model, ids: torch.Tensor, new_tokens: int, repeats: int, *, hit: bool,
            mask: torch.Tensor | None = None) -> dict:
    """Best-of-`repeats` CPU seconds of stock and wrapped `generate` on the same input, interleaved."""
    mask = torch.ones_like(ids) if mask is None else mask
    kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    stock_s, ours_s = [], []
    for _ in range(repeats):
        stock_time, stock_out = timed(lambda: model.generate(ids, **kwargs))
        hf_paged.wrap(model)
        try:
            engine = hf_paged.engine_of(model)
            if hit:
                model.generate(ids, **kwargs)  # the prompt is now in the prefix cache
            else:
                engine.reset_prefix_cache()
            ours_time, ours_out = timed(lambda: model.generate(ids, **kwargs))
        finally:
            hf_paged.unwrap(model)
        assert torch.equal(stock_out, ours_out), "wrapped generate differs from stock"
        stock_s.append(stock_time)
        ours_s.append(ours_time)
    return {"stock_s": min(stock_s), "ours_s": min(ours_s), "speedup": min(stock_s) / min(ours_s)}


# -- part 2: per-step breakdown ------------------------------------------------------------------------------------
# (label, module, attribute, is it inside the forward)
_PROBES = (
    ("weights check", "hf_paged.batching.engine", "Engine._check_weights", False),
    ("schedule", "hf_paged.batching.scheduler", "Scheduler.schedule", False),
    ("step inputs", "hf_paged.batching.engine", "build_step_inputs", False),
    ("sampler + processors", "hf_paged.batching.sampler", "Sampler.__call__", False),
    ("prefix-cache insert", "hf_paged.cache.kv_manager", "KVCacheManager.cache_full_blocks", False),
    ("attention plan", "hf_paged.cache.attention_backends", "build_attention_plan", True),
    ("attention plan", "hf_paged.cache.attention_backends", "plan_cpu_attention", True),
    ("K/V store", "hf_paged.cache.paged_layer", "PagedLayer.store", True),
    ("attention", "hf_paged.cache.attention_backends", "run_attention_plan", True),
    ("attention", "hf_paged.cache.attention_backends", "run_cpu_attention", True),
)


@contextmanager
def probes(totals: dict[str, float]):
    """Patch each probed function to add its thread CPU time to `totals[label]` (outermost call only)."""
    import importlib

    saved = []
    active: set[str] = set()

    def wrap(label, fn):
        def timed_call(*args, **kwargs):
            if label in active:
                return fn(*args, **kwargs)
            active.add(label)
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label] += time.thread_time() - start
                active.discard(label)
        return timed_call

    for label, module_name, attr, _inside in (*_PROBES, ("forward", "hf_paged.batching.model_runner",
                                                          "ModelRunner.forward", False),
                                              ("step", "hf_paged.batching.engine", "Engine.step", False)):
        module = importlib.import_module(module_name)
        owner, name = (getattr(module, attr.split(".")[0]), attr.split(".")[1]) if "." in attr else (module, attr)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, wrap(label, original))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def breakdown(model, batch: int, prompt_len: int, new_tokens: int) -> dict[str, float]:
    """Milliseconds of thread CPU per decode-only step, by part."""
    engine = Engine(model, PagedConfig(max_num_seqs=max(batch, 1)))
    ids = prompts(model, batch, prompt_len, seed=7).tolist()
    rids = [engine.add_request(p, SamplingParams(max_new_tokens=new_tokens)) for p in ids]
    while any(engine.requests[r].num_computed_tokens < prompt_len for r in rids):
        engine.step()  # prefill, not measured
    totals: dict[str, float] = defaultdict(float)
    steps = 0
    with probes(totals):
        while engine.has_unfinished:
            engine.step()
            steps += 1
    engine.run(rids)
    per_step = {k: 1000 * v / steps for k, v in totals.items()}
    inside = sum(per_step.get(label, 0.0) for label in {label for label, *_rest, is_inside in _PROBES if is_inside})
    per_step["forward, rest (model)"] = per_step["forward"] - inside
    per_step["engine outside forward"] = per_step["step"] - per_step["forward"]
    per_step["steps"] = steps
    return per_step


# -- part 3: decode stalls under arrivals ---------------------------------------------------------------------------
def stall_model() -> torch.nn.Module:
    """A random Llama of ~60M parameters (hidden 512 x 8 layers, vocabulary 32k), where a long prefill chunk
    costs many decode steps."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                                         max_position_embeddings=4096)).eval()
    model.generation_config.eos_token_id = None
    return model


def arrivals_workload(n: int, rate: float, seed: int) -> list[tuple[float, int, int]]:
    """(arrival second, prompt tokens, new tokens): Poisson arrivals, lognormal lengths (long tails)."""
    import random

    rng, at, out = random.Random(seed), 0.0, []
    for _ in range(n):
        prompt = int(min(max(rng.lognormvariate(5.7, 0.9), 32), 1800))  # median ~300 tokens
        new = int(min(max(rng.lognormvariate(4.2, 0.6), 8), 256))  # median ~64 tokens
        out.append((at, prompt, new))
        at += rng.expovariate(rate)
    return out


def run_arrivals(model, workload, limit: int | None) -> dict:
    """Open-loop arrivals on the engine loop; token gaps and TTFT as the callers see them."""
    import asyncio

    engine = Engine(model, PagedConfig(max_prefill_tokens_per_step=limit))
    gen = torch.Generator().manual_seed(1)
    gaps: list[float] = []
    ttfts: list[float] = []
    tokens = 0

    async def one(at: float, prompt_len: int, new: int, start: float) -> None:
        nonlocal tokens
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        ids = torch.randint(3, 32000, (prompt_len,), generator=gen).tolist()
        sent = last = time.perf_counter()
        params = SamplingParams(max_new_tokens=new)
        async for delta in engine.loop.generate_async(ids, params):
            if delta.new_token_ids:
                now = time.perf_counter()
                (gaps if tokens and last != sent else ttfts).append(now - last)
                last = now
                tokens += len(delta.new_token_ids)

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(one(at, p, n, start) for at, p, n in workload))
        return time.perf_counter() - start

    span = asyncio.run(main())
    engine.loop.shutdown()
    pct = lambda xs, q: sorted(xs)[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]  # noqa: E731
    return {"limit": limit, "tokens_per_s": tokens / span, "span_s": span, "itl_p50": pct(gaps, 50),
            "itl_p99": pct(gaps, 99), "ttft_p50": pct(ttfts, 50), "ttft_p99": pct(ttfts, 99)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama", "qwen2", "tiny-lm"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 32], help="batch sizes of the breakdown")
    parser.add_argument("--arrivals", type=int, default=0,
                        help="part 3 only: this many requests at --rate per second on a 60M random Llama, with "
                             "max_prefill_tokens_per_step in --limits (0 = none, the other parts run)")
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--limits", type=int, nargs="+", default=[0, 256, 64],
                        help="max_prefill_tokens_per_step values to compare (0: no bound, the default)")
    args = parser.parse_args(argv)
    if args.arrivals:
        return main_arrivals(args, argv)
    torch.set_num_threads(1)
    command = f"python benchmarks/latency.py {' '.join(argv if argv is not None else sys.argv[1:])}".strip()
    print(f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.2f}\ncommand: {command}")
    print(f"prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, greedy, fp32, 1 torch thread, "
          f"best of {args.repeats}, process CPU time\n")
    print("| model | case | stock s | hf_paged s | hf_paged speed vs stock |")
    print("|---|---|---|---|---|")
    models = {name: build_model(name) for name in args.models}
    for name, model in models.items():
        cases = (("batch 1, cold", 1, False), ("batch 1, prefix hit", 1, True), ("batch 4, cold", 4, False),
                 ("batch 4 ragged, cold", 4, False))
        for case, batch, hit in cases:
            ids = prompts(model, batch, args.prompt_len, seed=batch)
            mask = None
            if "ragged" in case:  # prompts of 1/4 .. 4/4 of the length, left-padded as stock wants them
                rows = [ids[i, : args.prompt_len * (i + 1) // batch].tolist() for i in range(batch)]
                ids, mask = left_pad(rows)
            r = compare(model, ids, args.new_tokens, args.repeats, hit=hit, mask=mask)
            print(f"| {name} | {case} | {r['stock_s']:.3f} | {r['ours_s']:.3f} | {r['speedup']:.2f}x |", flush=True)
    parts = [label for label, *_ in _PROBES]
    header = ["forward", "forward, rest (model)", "attention plan", "K/V store", "attention",
              "engine outside forward", *[p for p in parts if p not in ("attention plan", "K/V store", "attention")]]
    print("\nper decode step, ms of thread CPU (engine driven directly)\n")
    print("| model | batch | step | " + " | ".join(header) + " |")
    print("|---|---|---|" + "---|" * len(header))
    for name, model in models.items():
        for batch in args.batches:
            b = breakdown(model, batch, args.prompt_len, args.new_tokens)
            cells = " | ".join(f"{b.get(h, 0.0):.3f}" for h in header)
            print(f"| {name} | {batch} | {b['step']:.3f} | {cells} |", flush=True)
    return 0


def main_arrivals(args, argv) -> int:
    torch.set_num_threads(1)
    command = f"python benchmarks/latency.py {' '.join(argv if argv is not None else sys.argv[1:])}".strip()
    print(f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.2f}\ncommand: {command}")
    workload = arrivals_workload(args.arrivals, args.rate, seed=3)
    print(f"{args.arrivals} requests, Poisson {args.rate:g}/s, prompts {sum(w[1] for w in workload)} tokens "
          f"(max {max(w[1] for w in workload)}), {sum(w[2] for w in workload)} new tokens; 1 torch thread\n")
    print("| max_prefill_tokens_per_step | tokens/s | ITL p50 ms | ITL p99 ms | p99/p50 | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|---|---|---|")
    model = stall_model()
    for limit in args.limits:
        r = run_arrivals(model, workload, limit or None)
        print(f"| {limit or 'none'} | {r['tokens_per_s']:.1f} | {1000 * r['itl_p50']:.0f} | {1000 * r['itl_p99']:.0f} | "
              f"{r['itl_p99'] / r['itl_p50']:.1f}x | {1000 * r['ttft_p50']:.0f} | {1000 * r['ttft_p99']:.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
