"""Many samples of a prompt (pass@k, self-consistency): `generate(..., do_sample=True, num_return_sequences=n)`.

Stock `generate` runs the n rows as one padded batch; the wrapped model runs them as forks of one prompt (its blocks
shared) in continuous batches. A third column runs the engine with every sampled row processed and drawn on its own
(`Sampler._draw_together` switched off: the sampler before it), so the table shows what drawing rows together pays.
Each cell: CPU seconds of the process (`time.process_time`), the fastest of `--repeats`, the three sides interleaved
in every repeat. Settings: stock's default sampling (top_k=50, from GenerationConfig) and HumanEval's
(temperature 0.8, top_p 0.95). Workloads: one prompt x n in {16, 64, 200}, and 8 prompts x n=20, 64 new tokens.

    OMP_NUM_THREADS=1 python benchmarks/sampled_n.py [--model tiny|gqa6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine, print_table

import hf_paged
from hf_paged.batching import sampler as sampler_module

SETTINGS = {"top_k=50 (default)": {}, "T=0.8, top_p=0.95": {"temperature": 0.8, "top_p": 0.95}}
WORKLOADS = [(1, 16), (1, 64), (1, 200), (8, 20)]  # (prompts, n)


def load(name: str):
    if name == "tiny":
        model, _ = hf_paged.default_model()
        vocab = model.config.vocab_size
    else:
        from benchmarks.throughput import small_llama

        model, vocab = small_llama(vocab=32000, hidden=512, layers=6, kv_heads=2), 32000
    return model, vocab


def prompts(count: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(count)
    lengths = [24 + 13 * i for i in range(count)]
    ids = torch.zeros(count, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):  # left padding, as a tokenizer for generation pads
        ids[row, -length:] = torch.randint(3, min(vocab, 250), (length,), generator=g)
        mask[row, -length:] = 1
    return ids, mask


def run(model, ids, mask, n: int, setting: dict, new_tokens: int) -> tuple[float, int]:
    torch.manual_seed(0)
    start = time.process_time()
    out = model.generate(ids, attention_mask=mask, do_sample=True, num_return_sequences=n,
                         max_new_tokens=new_tokens, pad_token_id=0, **setting)
    return time.process_time() - start, out.shape[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "gqa6"], default="tiny",
                        help="tiny: the embedded model; gqa6: a random 6-layer Llama with 2 KV heads, 32k vocab")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    model, vocab = load(args.model)
    together = sampler_module._drawn_together
    hf_paged.wrap(model)
    run(model, *prompts(1, vocab), 4, {}, 8)  # the engine and its kernels made before anything is timed
    rows = []
    for name, setting in SETTINGS.items():
        for count, n in WORKLOADS:
            ids, mask = prompts(count, vocab)
            best = {"stock": float("inf"), "engine": float("inf"), "row by row": float("inf")}
            for _ in range(args.repeats):
                hf_paged.unwrap(model)
                best["stock"] = min(best["stock"], run(model, ids, mask, n, setting, args.new_tokens)[0])
                hf_paged.wrap(model)
                best["engine"] = min(best["engine"], run(model, ids, mask, n, setting, args.new_tokens)[0])
                sampler_module._drawn_together = lambda request: False
                try:
                    best["row by row"] = min(best["row by row"], run(model, ids, mask, n, setting,
                                                                     args.new_tokens)[0])
                finally:
                    sampler_module._drawn_together = together
            rows.append([name, f"{count} x n={n}", best["stock"], best["engine"], best["row by row"],
                         f"{best['stock'] / best['engine']:.2f}x", f"{best['stock'] / best['row by row']:.2f}x"])
            print(rows[-1], flush=True)
    hf_paged.unwrap(model)
    print(f"\n{machine()}; model {args.model}; {args.new_tokens} new tokens; fastest of {args.repeats}, CPU s; "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print_table(["sampling", "prompts x n", "stock s", "hf_paged s", "row by row s", "speed-up", "row by row"],
                rows)


if __name__ == "__main__":
    main()
