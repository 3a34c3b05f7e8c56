"""Block-sparse prefill (issue 41, point 1): attention-op speed and answers against dense on 8k-16k-token prompts.

Two parts, on one torch thread, CPU time (`time.process_time`):

1. The attention op alone. One passkey prompt per length runs through the model once (dense, no cache) with a
   recording attention that keeps every layer's post-RoPE q/k/v. Then, per layer and repeat, interleaved: dense =
   the op the engine runs for a one-shot prefill (`F.scaled_dot_product_attention`, causal, GQA, over the
   contiguous context: `reference.run_attention_plan`'s in-place prefill group), sparse = what
   `sparse_prefill.attend_sparse_groups` runs for it (`SparsePrefill.select` + `block_sparse_attention`). Reported:
   summed CPU seconds over the layers, the ratio dense / sparse, and the share of causal blocks kept.
2. Answers through the engine (one-shot prefill: `max_num_batched_tokens` = the prompt, no prefix cache), per
   prompt dense first, then each sparse setting: passkey prompts (`cli.datasets.passkey_example`) with the key at
   `--depths` evenly spaced depths; dense generates 64 greedy tokens (EOS suppressed), each sparse setting prefills
   the prompt sparsely and then decodes (densely, as the engine always does) teacher-forced by dense's tokens.
   Reported: top-1 agreement with dense over the 64 positions, prompts whose first 5 top-1 tokens equal dense's, and
   passkey retrieval (the first 5 bytes are the key; for a sparse setting its top-1 under dense's tokens, which is
   its own greedy answer whenever dense's answer is right).

Models: `tiny` (the embedded trained 2.3M byte-level Llama; trained at <= 1024 tokens, max_position_embeddings
2048 raised here so the engine takes longer prompts; RoPE theta 1e7) and `llama55m` (`latency.stall_model`'s random
Llama, hidden 512 x 8 layers, 8 heads / 4 KV heads; ~57M parameters with its 32k vocabulary: it retrieves nothing,
so its answers are compared with dense's token for token).

    python benchmarks/sparse_prefill.py --model tiny --lengths 8192 16384 --depths 20
    python benchmarks/sparse_prefill.py --model llama55m --lengths 8192 --depths 4 --keep 0.2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.kernels.block_sparse import block_sparse_attention
from hf_paged.cache.sparse_prefill import SparsePrefill
from hf_paged.cli.datasets import passkey_example

NEW_TOKENS = 64


def load(name: str, max_len: int) -> torch.nn.Module:
    if name == "tiny":
        from hf_paged.api.models import default_model

        model = default_model().model
    else:
        from benchmarks.latency import stall_model

        model = stall_model()
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, max_len)
    return model.eval()


def record_qkv(model, prompt: list[int]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]:
    """Every layer's post-RoPE q `[T, H, D]`, k/v `[T, Hkv, D]` and scale for one dense forward of `prompt`."""
    from transformers import AttentionInterface

    records = []

    def recording(module, query, key, value, attention_mask, *, scaling=None, dropout=0.0, **kwargs):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        records.append((query[0].transpose(0, 1).contiguous(), key[0].transpose(0, 1).contiguous(),
                        value[0].transpose(0, 1).contiguous(), scale))
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale, enable_gqa=True)
        return out.transpose(1, 2), None

    AttentionInterface.register("sparse_bench_record", recording)
    previous = model.config._attn_implementation
    model.set_attn_implementation("sparse_bench_record")
    try:
        with torch.inference_mode():
            model(torch.tensor([prompt]), use_cache=False, logits_to_keep=1)
    finally:
        model.set_attn_implementation(previous)
    return records


def dense_op(q, k, v, scale):
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)[0]


def sparse_op(sparse: SparsePrefill, q, k, v, scale):
    selection = sparse.select(q, k, scale=scale)
    return block_sparse_attention(q, k, v, selection, scale=scale), selection


def time_ops(records, settings: dict[str, SparsePrefill], repeats: int) -> dict[str, dict]:
    """CPU seconds over all layers per repeat (dense and every setting interleaved layer by layer), kept share, and
    the largest output difference from dense."""
    times = {name: [0.0] * repeats for name in ["dense", *settings]}
    share = {name: [] for name in settings}
    err = dict.fromkeys(settings, 0.0)
    for r in range(repeats):
        for q, k, v, scale in records:
            t = time.process_time()
            ref = dense_op(q, k, v, scale)
            times["dense"][r] += time.process_time() - t
            for name, sparse in settings.items():
                t = time.process_time()
                out, selection = sparse_op(sparse, q, k, v, scale)
                times[name][r] += time.process_time() - t
                if r == 0:
                    share[name].append(selection.kept_share(k.shape[0], q.shape[0]))
                    err[name] = max(err[name], float((out.transpose(0, 1) - ref).abs().max()))
    return {name: {"times": ts, "share": statistics.mean(share[name]) if name in share else 1.0,
                   "err": err.get(name, 0.0)} for name, ts in times.items()}


def engine_for(model, length: int, sparse: SparsePrefill | None) -> Engine:
    block = 16
    config = PagedConfig(block_size=block, num_blocks=-(-(length + NEW_TOKENS + block) // block) + 4,
                         max_num_batched_tokens=length, max_num_seqs=1, enable_prefix_caching=False,
                         sparse_prefill=sparse.pattern if sparse else None,
                         sparse_prefill_min_tokens=sparse.min_tokens if sparse else 8192,
                         sparse_keep_ratio=sparse.keep_ratio if sparse else 0.2)
    return Engine(model, config)


class ForceNext(LogitsProcessor):
    """Teacher forcing: the next token is the reference's (dense's), whatever the model says; raw logits are kept."""

    def __init__(self, reference: list[int]) -> None:
        self.reference = reference

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.reference[input_ids.shape[-1]]] = 0.0
        return forced


def answers(model, length: int, depths: list[float], settings: dict[str, SparsePrefill], seed0: int) -> dict:
    """Per setting: passkeys right, prompts whose first 5 tokens equal dense's, top-1 agreement with dense on the
    next 64 tokens (teacher-forced by dense's tokens: decode is dense in both, only the prefill differs)."""
    engines = {"dense": engine_for(model, length, None)}
    engines.update({name: engine_for(model, length, s) for name, s in settings.items()})
    rows = {name: {"right": 0, "agree": [], "cpu": 0.0, "same_answer": 0} for name in engines}
    for i, depth in enumerate(depths):
        ex = passkey_example(seed0 + i, length, depth=depth)
        said, dense = [], []  # dense runs first
        for name, engine in engines.items():
            if name == "dense":
                params = SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
            else:
                params = SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, output_logits=True,
                                        logits_processors=[ForceNext(ex.prompt_ids + dense)])
            t = time.process_time()
            rid = engine.add_request(ex.prompt_ids, params)
            out = engine.run([rid])[rid]
            rows[name]["cpu"] += time.process_time() - t
            if out.error is not None:
                raise RuntimeError(f"{name}: {out.error}")
            if name == "dense":
                dense = tokens = out.generated_tokens
            else:
                tokens = [int(x.argmax()) for x in out.logits]
            text = bytes(t for t in tokens[:5] if t < 256).decode("latin-1")
            rows[name]["right"] += text == ex.answer
            rows[name]["agree"].append(sum(a == b for a, b in zip(tokens, dense)) / NEW_TOKENS)
            rows[name]["same_answer"] += tokens[:5] == dense[:5]
            said.append(f"{name} {text!r} {rows[name]['agree'][-1]:.2f}")
        print(f"  {length} depth {depth:.2f} (key {ex.answer}): " + ", ".join(said), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "llama55m"], default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--depths", type=int, default=20, help="passkey depths per length (0 to skip part 2)")
    parser.add_argument("--patterns", nargs="+", default=["vertical_slash", "block", "auto"])
    parser.add_argument("--keep", type=float, nargs="+", default=[0.1, 0.2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-ops", action="store_true", help="answers only")
    parser.add_argument("--seed", type=int, default=7_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load(args.model, max(args.lengths) + NEW_TOKENS + 64)
    print(f"# sparse prefill, model {args.model}; {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"command: python {' '.join(sys.argv)}\n")
    for length in args.lengths:
        settings = {f"{p} r={r}": SparsePrefill(p, min(4096, length), r) for p in args.patterns for r in args.keep}
        if not args.skip_ops:
            records = record_qkv(model, passkey_example(args.seed, length, depth=0.5).prompt_ids)
            ops = time_ops(records, settings, args.repeats)
            del records
            dense = ops["dense"]["times"]
            print(f"## {length} tokens: attention op, CPU s over {model.config.num_hidden_layers} layers "
                  f"(repeats {args.repeats})\n")
            print("| setting | kept share | CPU s (each repeat) | dense / sparse (each repeat) | max abs diff |")
            print("|---|---|---|---|---|")
            for name, row in ops.items():
                ratio = " / ".join(f"{d / s:.2f}x" for d, s in zip(dense, row["times"]))
                print(f"| {name} | {row['share']:.3f} | {' / '.join(f'{t:.2f}' for t in row['times'])} | {ratio} | "
                      f"{row['err']:.2e} |")
            print(flush=True)
        if args.depths:
            depths = [i / max(args.depths - 1, 1) for i in range(args.depths)]
            rows = answers(model, length, depths, settings, args.seed)
            print(f"## {length} tokens: answers through the engine ({args.depths} passkey prompts, {NEW_TOKENS} "
                  "greedy tokens)\n")
            print("| setting | passkey right | first 5 tokens = dense's | top-1 agreement with dense (mean / min) | "
                  "CPU s (prefill + 64 tokens, all prompts) |")
            print("|---|---|---|---|---|")
            n = len(depths)
            for name, row in rows.items():
                agree = f"{statistics.mean(row['agree']):.3f} / {min(row['agree']):.3f}"
                print(f"| {name} | {row['right']}/{n} | {row['same_answer']}/{n} | {agree} | {row['cpu']:.1f} |")
            print(flush=True)


if __name__ == "__main__":
    main()
