"""`hf-paged bench`: a benchmark workload on any model, hf_paged vs stock `generate`, as JSON (and a PNG plot)."""

from __future__ import annotations

import json
import platform
import sys
import time

import torch

from hf_paged.cli import workloads


def _workload(name: str, num_prompts: int, vocab: int) -> workloads.Workload:
    ids = (3, max(4, min(vocab, 1000)))
    if name == "ragged":
        return workloads.ragged(num_prompts=num_prompts, max_len=400, min_new=16, max_new=64, vocab=ids)
    if name == "shared-prefix":
        return workloads.shared_prefix(num_questions=num_prompts, prefix_len=400, vocab=ids)
    if name == "few-shot":
        return workloads.few_shot(num_queries=num_prompts, vocab=ids)
    return workloads.multi_turn(num_users=max(1, num_prompts // 4), vocab=ids)


def _stock(model, prompts, wants, pad) -> tuple[float, list[float]]:
    start = time.perf_counter()
    latencies = []
    for s in range(0, len(prompts), 8):
        chunk, new = prompts[s:s + 8], wants[s:s + 8]
        ids, mask = workloads.left_pad(chunk, pad)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids.to(model.device), attention_mask=mask.to(model.device), max_new_tokens=max(new),
                           do_sample=False, pad_token_id=pad)
        latencies.append(time.perf_counter() - t0)
    return time.perf_counter() - start, latencies


def run_bench(args) -> dict:
    from hf_paged import SamplingParams, engine_of, unwrap, wrap
    from hf_paged.api.loading import load_model
    from hf_paged.errors import CliError

    if args.num_prompts < 1:
        raise CliError("--num-prompts must be >= 1")
    model, _ = load_model(args.model, args.device, args.dtype)
    work = _workload(args.workload, args.num_prompts, model.config.vocab_size)
    prompts, wants = list(work.prompts), list(work.max_new_tokens)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    wrap(model)
    try:
        start = time.perf_counter()
        outs = model.generate_batch(prompts, sampling_params=[SamplingParams(max_new_tokens=w) for w in wants])
        for turn in range(len(work.messages[0]) if work.messages else 0):  # multi-turn: follow-up turns
            prompts = [workloads.next_turn(p, o.generated_tokens, m[turn])
                       for p, o, m in zip(prompts, outs.values(), work.messages)]
            outs = model.generate_batch(prompts, sampling_params=[SamplingParams(max_new_tokens=w) for w in wants])
        paged_seconds = time.perf_counter() - start
        stats = engine_of(model).stats()
    finally:
        unwrap(model)
    stock_seconds, _ = _stock(model, work.prompts, work.max_new_tokens, pad)
    generated = stats["generated_tokens"]
    stock_tokens = sum(work.max_new_tokens)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, device {args.device}",
        "model": args.model, "dtype": args.dtype, "workload": args.workload, "num_requests": len(work.prompts),
        "hf_paged": {"seconds": paged_seconds, "tokens_per_s": generated / paged_seconds,
                     "ttft_p50_s": stats["ttft_p50_s"], "ttft_p99_s": stats["ttft_p99_s"],
                     "tpot_p50_s": stats["tpot_p50_s"], "tpot_p99_s": stats["tpot_p99_s"],
                     "prefix_hit_rate": stats["prefix_hit_rate"], "preemptions": stats["preemptions"]},
        "stock_generate_batches_of_8": {"seconds": stock_seconds, "tokens_per_s": stock_tokens / stock_seconds,
                                        "note": "first turn only" if work.messages else ""},
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    if args.plot:
        _plot(result, args.plot)
    return result


def _plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("hf-paged: matplotlib is not installed (pip install 'hf_paged[plot]'): no plot written",
              file=sys.stderr)
        return
    ours, stock = result["hf_paged"], result["stock_generate_batches_of_8"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(["stock generate", "hf_paged"], [stock["tokens_per_s"], ours["tokens_per_s"]], color=["grey", "tab:blue"])
    left.set_ylabel("generated tokens / s")
    left.set_title(f"throughput ({result['workload']})")
    names = ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
    values = [ours[k] or 0 for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")]
    right.bar(names, [v * 1000 for v in values], color="tab:blue")
    right.set_ylabel("milliseconds")
    right.set_title("hf_paged latency percentiles")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}")
