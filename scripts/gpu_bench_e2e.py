"""End-to-end throughput on a ragged workload: stock `generate` vs transformers' `generate_batch` vs hf_paged's.

    python scripts/gpu_bench_e2e.py --json e2e.json      # random Llama with the shape of an 8B model, bf16, CUDA
    python scripts/gpu_bench_e2e.py --tiny               # CPU smoke test of this script (tiny fp32 Llama)

The model is randomly initialised (no download): Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads / 8 KV
heads, MLP 14336, vocabulary 128256). Prompts have random lengths in [--min-prompt, --max-prompt] and random ids;
EOS is disabled so every request generates exactly --max-new-tokens (the work is identical for the three paths).
Each path first runs untimed on a workload of the same shape with other ids, 2 new tokens each (compilation of every
kernel specialisation, lazy init, CUDA graphs; no prefix the timed run could hit), then the whole workload is timed
wall-clock. tokens/s = generated tokens / seconds, prefill included.
Stock `generate` gets all prompts as one left-padded batch, which is how it is normally called.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
}
LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}


@dataclass(slots=True)
class PathResult:
    """One generation path over the whole workload."""

    name: str
    tokens: int = 0  # generated tokens counted in the outputs
    seconds: float = 0.0
    tokens_per_s: float = 0.0
    error: str | None = None  # the exception, when the path failed (the others still run)
    first_tokens: list[list[int]] = field(default_factory=list)  # first 8 tokens of the first 4 requests
    note: str = ""  # hf_paged: how many decode steps its CUDA graphs served


@dataclass(slots=True)
class E2EResult:
    device: str
    model: str
    workload: str
    paths: list[PathResult]


def make_workload(num_requests: int, min_prompt: int, max_prompt: int, vocab: int, seed: int) -> list[list[int]]:
    """Ragged random prompts (ids >= 3, clear of the usual special tokens)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(min_prompt, max_prompt))] for _ in range(num_requests)]


def generation_config(max_new_tokens: int):
    from transformers import GenerationConfig

    # eos_token_id=None: no request stops early. A fresh copy per call: transformers' generate_batch writes into it.
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)


def build_model(shape: dict, dtype: torch.dtype, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise directly in bf16 on the device: no fp32 copy of 8B weights
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def run_stock_generate(model, prompts: list[list[int]], max_new_tokens: int) -> tuple[int, list[list[int]]]:
    width = max(len(p) for p in prompts)
    device = model.device
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as generate expects for decoder-only models
        ids[i, width - len(p) :] = torch.tensor(p, device=device)
        mask[i, width - len(p) :] = 1
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation_config(max_new_tokens))
    new = out[:, width:]
    return new.numel(), new[:4, :8].tolist()


def run_generate_batch(model, prompts: list[list[int]], max_new_tokens: int, cb_config=None):
    kwargs = {} if cb_config is None else {"continuous_batching_config": cb_config}
    outputs = model.generate_batch(prompts, generation_config(max_new_tokens), **kwargs)
    ordered = [outputs[f"req_{i}"] for i in range(len(prompts))]
    return sum(len(o.generated_tokens) for o in ordered), [list(o.generated_tokens[:8]) for o in ordered[:4]]


def timed(name: str, fn, warm_fn, device: torch.device) -> PathResult:
    result = PathResult(name)
    try:
        warm_fn()
        sync(device)
        t0 = time.perf_counter()
        result.tokens, result.first_tokens = fn()
        sync(device)
        result.seconds = time.perf_counter() - t0
        result.tokens_per_s = result.tokens / result.seconds
    except Exception as exc:  # noqa: BLE001 - one failing path must not hide the others' numbers
        traceback.print_exc()
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(args):
    """Yields one `E2EResult` per workload (the ragged one first), so a caller can save each as it comes."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = TINY if args.tiny else {"1b": LLAMA_1B, "8b": LLAMA_8B}[args.model]
    dtype = torch.float32 if args.tiny else torch.bfloat16
    model = build_model(shape, dtype, device)
    label = ("tiny Llama" if args.tiny else f"Llama {args.model.upper()} shape") + f", random weights, {str(dtype)[6:]}"
    vocab = shape["vocab_size"]
    # warm-up: a workload of the same shape with other ids (no prefix hits in the timed run), 2 new tokens each, so
    # every kernel specialisation the timed run needs (batch sizes, chunk widths) is compiled before the clock
    ragged = make_workload(args.num_requests, args.min_prompt, args.max_prompt, vocab, args.seed)
    ragged_warm = make_workload(args.num_requests, args.min_prompt, args.max_prompt, vocab, args.seed + 1)
    yield run_workload(args, model, device, label, ragged, ragged_warm, args.max_new_tokens, prefix_off=False)
    if args.shared_prefix:
        # benchmarks/prefix.py's workload (a): one long system prompt, then different questions
        from hf_paged.cli.workloads import shared_prefix

        prefix_len = 40 if args.tiny else 1000
        shared = shared_prefix(args.num_requests, prefix_len, vocab=(3, vocab), seed=args.seed).prompts
        shared_warm = shared_prefix(args.num_requests, prefix_len, vocab=(3, vocab), seed=args.seed + 1).prompts
        yield run_workload(args, model, device, label, shared, shared_warm, args.shared_new_tokens, prefix_off=True)


def run_workload(args, model, device: torch.device, label: str, prompts: list[list[int]],
                 warm_prompts: list[list[int]], n: int, *, prefix_off: bool) -> E2EResult:
    """Every path over one workload: stock padded `generate`, transformers' `generate_batch` (CUDA graphs off and
    on), hf_paged's `generate_batch` (decode graphs on, and off; prefix caching off too where `prefix_off`)."""
    from transformers import ContinuousBatchingConfig

    # on CPU transformers sizes its cache from "free memory" for minutes: size it here
    sizing = {} if device.type == "cuda" else {"num_blocks": 64, "max_batch_tokens": 256}
    paths = [
        timed(
            "stock generate (padded batch)",
            lambda: run_stock_generate(model, prompts, n),
            lambda: run_stock_generate(model, warm_prompts, 2),
            device,
        )
    ]
    for graphs in () if args.skip_transformers else (False, True) if device.type == "cuda" else (False,):
        cb_config = ContinuousBatchingConfig(use_cuda_graph=graphs, auto_switch_to_flash=False, **sizing)
        paths.append(timed(
            f"transformers generate_batch (CUDA graphs {'on' if graphs else 'off'})",
            lambda c=cb_config: run_generate_batch(model, prompts, n, c),
            lambda c=cb_config: run_generate_batch(model, warm_prompts, 2, c),
            device,
        ))
        model.set_attn_implementation("sdpa")  # generate_batch switched it to its paged one
    import hf_paged

    total_blocks = sum(-(-(len(p) + n) // args.block_size) for p in prompts)
    variants = [("hf_paged generate_batch", {})]
    if device.type == "cuda":  # the same engine without its decode graphs: what the graphs win
        variants.append(("hf_paged generate_batch (decode graphs off)", {"cuda_graphs": False}))
    if prefix_off:
        variants.append(("hf_paged generate_batch (prefix caching off)", {"enable_prefix_caching": False}))
    for name, overrides in variants:
        try:
            hf_paged.wrap(model, hf_paged.PagedConfig(
                block_size=args.block_size, num_blocks=int(total_blocks * 1.25) + 16, max_num_seqs=len(prompts),
                max_num_batched_tokens=args.max_batched_tokens, **overrides))
            result = timed(name, lambda: run_generate_batch(model, prompts, n),
                           lambda: run_generate_batch(model, warm_prompts, 2), device)
            stats = hf_paged.engine_of(model).stats()
            result.note = (f"{stats['decode_graph_replays']} decode steps replayed from "
                           f"{stats['decode_graphs_captured']} captured graphs, prefix hit rate "
                           f"{stats['prefix_hit_rate']:.2f}")
            paths.append(result)
            hf_paged.unwrap(model)
        except Exception as exc:  # noqa: BLE001 - wrapping failed: report it in the table, keep the rest
            traceback.print_exc()
            paths.append(PathResult(name, error=f"{type(exc).__name__}: {exc}"[:300]))
    lens = [len(p) for p in prompts]
    return E2EResult(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        model=label,
        workload=("shared prefix: " if prefix_off else "ragged: ")
        + f"{len(prompts)} requests, prompts {min(lens)}-{max(lens)} tokens (mean {sum(lens) / len(lens):.0f}), "
        f"{n} new tokens each, greedy",
        paths=paths,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["1b", "8b"], default="1b")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shared-prefix", action=argparse.BooleanOptionalAction, default=True,
                   help="also the shared-prefix workload: a 1000-token system prompt + one question per request")
    p.add_argument("--shared-new-tokens", type=int, default=32)
    p.add_argument("--skip-transformers", action="store_true", help="no transformers generate_batch paths")
    p.add_argument("--tiny", action="store_true", help="tiny fp32 Llama: a CPU smoke test of this script")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    if args.tiny:
        args.num_requests, args.min_prompt, args.max_prompt, args.max_new_tokens = 6, 3, 40, 8
        args.max_batched_tokens, args.shared_new_tokens = 64, 4
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    done = []
    for result in run(args):  # saved after each workload: a time limit hit in the second keeps the first
        done.append(asdict(result))
        text = json.dumps(done, indent=2)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text)
    print(text)


if __name__ == "__main__":
    main()
