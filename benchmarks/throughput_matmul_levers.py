"""The matmul-bound steps (issues 44 and 36 point 5): three levers on the lean forward's matmuls, measured with bits.

    OMP_NUM_THREADS=1 python benchmarks/throughput_matmul_levers.py [--parts head,merged,instep]

`head`: the lm_head of the 51M Llama (GPT-2's [50257, 512] weight) as today (`lean_forward._head`: slices of 1,024
vocabulary rows), as one `mm`, and the other way round (logits^T = W @ x^T, MKL packing the small side, then a
transpose copy; whole and in slices), at 1-64 rows: CPU ms and whether each equals the one `mm` bit for bit.
`merged`: q/k/v as one [q + 2 kv, hidden] weight and gate/up as one [2 x intermediate, hidden] weight (the split
weights are row views of the merged ones) against the split products, on the 51M model's and gqa6's shapes, weights
streamed as in a step (every layer's weights once, the lm_head between repeats): CPU ms of a step's layer matmuls,
pairs interleaved, and whether the merged product's columns equal the split ones.
`instep`: every `_linear` / `_head` call of real decode steps timed inside the engine (thread CPU time) against the
same (weight shape, rows) product repeated alone, where its weight stays in the core's caches: gqa6's timed
`generate_batch` (decode steps) and 32 prompts of 50-400 tokens on the 51M Llama (its 32-row decode steps).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_PAGED_JIT", "now")

import hf_paged
from benchmarks.common import machine
from hf_paged.batching import lean_forward, model_runner

V51, D51, I51, KV51, L51 = 50257, 512, 1408, 256, 8  # the 51M Llama of benchmarks/lm_eval.py (4 KV heads of 64)


def _cpu_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times) * 1e3


def head_part() -> None:
    torch.manual_seed(0)
    weight = torch.randn(V51, D51) * 0.02
    head = torch.nn.Linear(D51, V51, bias=False)
    head.weight.data = weight

    def other_way(x: torch.Tensor, chunk: int | None) -> torch.Tensor:
        if chunk is None:
            return torch.mm(weight, x.t()).t().contiguous()
        out_t = torch.empty(V51, x.shape[0])
        starts = range(0, V51 - chunk + 1, chunk)
        for start, end in zip(starts, [*starts[1:], V51]):
            torch.mm(weight[start:end], x.t(), out=out_t[start:end])
        return out_t.t().contiguous()

    print("| rows | one mm ms | sliced (today) ms | other way ms | other way, slices of 8,192 ms | other way equal |"
          "\n|---|---|---|---|---|---|")
    for rows in (1, 2, 8, 32, 64):
        x = torch.randn(rows, D51)
        one = torch.mm(x, weight.t())
        assert torch.equal(lean_forward._head(head, x), one)
        same = torch.equal(other_way(x, None), one) and torch.equal(other_way(x, 8192), one)
        times = [_cpu_ms(f, 7) for f in (lambda x=x: torch.mm(x, weight.t()), lambda x=x: lean_forward._head(head, x),
                                          lambda x=x: other_way(x, None), lambda x=x: other_way(x, 8192))]
        print(f"| {rows} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {same} |")


def _layer_products(layer_weights, x, xi, d: int, kv: int, inter: int, *, merged: bool) -> None:
    """A step's layer matmuls: q, k, v, o, gate, up, down one by one, or q|k|v and gate|up as one product each."""
    for w, gu, (o, down) in layer_weights:
        parts = (w, o, gu) if merged else (w[:d], w[d:d + kv], w[d + kv:], o, gu[:inter], gu[inter:])
        for part in parts:
            torch.mm(x, part.t())
        torch.mm(xi, down.t())


def merged_part() -> None:
    print("\n| model shapes | rows | split ms | merged ms | split / merged (pairs' median) | merged columns equal split |"
          "\n|---|---|---|---|---|---|")
    for name, (d, inter, kv, layers, vocab), rows_list in (
            ("51M", (D51, I51, KV51, L51, V51), (1, 8, 32, 64)), ("gqa6", (256, 704, 64, 6, 1000), (32, 64, 512))):
        torch.manual_seed(0)
        qkv = [torch.randn(d + 2 * kv, d) for _ in range(layers)]
        gate_up = [torch.randn(2 * inter, d) for _ in range(layers)]
        o_down = [(torch.randn(d, d), torch.randn(d, inter)) for _ in range(layers)]
        head = torch.randn(vocab, d)

        layer_weights = list(zip(qkv, gate_up, o_down))

        for rows in rows_list:
            x, xi = torch.randn(rows, d), torch.randn(rows, inter)
            same = (torch.equal(torch.mm(x, qkv[0].t()),
                                torch.cat([torch.mm(x, w.t()) for w in (qkv[0][:d], qkv[0][d:d + kv], qkv[0][d + kv:])], 1))
                    and torch.equal(torch.mm(x, gate_up[0].t()),
                                    torch.cat([torch.mm(x, gate_up[0][s].t()) for s in (slice(0, inter),
                                                                                       slice(inter, None))], 1)))
            times = {"split": [], "merged": []}
            for i in range(12):
                for side in (("split", "merged") if i % 2 else ("merged", "split")):
                    torch.mm(x, head.t())  # a step's lm_head between: the layers' weights come from memory
                    start = time.thread_time()
                    _layer_products(layer_weights, x, xi, d, kv, inter, merged=side == "merged")
                    times[side].append(time.thread_time() - start)
            ratio = statistics.median(a / b for a, b in zip(times["split"], times["merged"]))
            print(f"| {name} | {rows} | {statistics.median(times['split']) * 1e3:.2f} | "
                  f"{statistics.median(times['merged']) * 1e3:.2f} | {ratio:.3f} | {same} |")


def _in_step(model, prompts, params, decode_rows) -> dict:
    """(weight shape, rows) -> thread CPU ns of every `_linear` / `_head` call of the decode steps whose row count
    `decode_rows` accepts, in one `generate_batch` after a warm-up."""
    calls: dict = collections.defaultdict(list)
    state = {"on": False}
    linear, head, forward = lean_forward._linear, lean_forward._head, model_runner.ModelRunner.forward

    def timed(fn):
        def call(module, x):
            if not state["on"]:
                return fn(module, x)
            start = time.thread_time_ns()
            out = fn(module, x)
            calls[(fn.__name__, tuple(module.weight.shape), x.shape[0])].append(time.thread_time_ns() - start)
            return out
        return call

    def step(self, input_ids, positions, metadata, logits_rows):
        state["on"] = len(input_ids) == len(logits_rows) and decode_rows(len(input_ids))
        try:
            return forward(self, input_ids, positions, metadata, logits_rows)
        finally:
            state["on"] = False

    hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=64))
    try:
        model.generate_batch(prompts[:2], sampling_params=params[:2])
        lean_forward._linear, lean_forward._head = timed(linear), timed(head)
        model_runner.ModelRunner.forward = step
        model.generate_batch(prompts, sampling_params=params)
    finally:
        lean_forward._linear, lean_forward._head, model_runner.ModelRunner.forward = linear, head, forward
        hf_paged.unwrap(model)
    return calls


def instep_part() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.throughput import workload_and_model

    work, gqa6 = workload_and_model("gqa6")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V51, hidden_size=D51, intermediate_size=I51, num_hidden_layers=L51,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=None)
    llama51 = LlamaForCausalLM(config).eval()
    llama51.generation_config.eos_token_id = None
    gen = torch.Generator().manual_seed(1)
    prompts51 = [torch.randint(0, V51, (int(n),), generator=gen).tolist()
                 for n in torch.randint(50, 400, (32,), generator=gen)]
    print("\n| workload | calls | in-step s | the same calls alone s | in-step / alone | of which the lm_head in-step / "
          "alone |\n|---|---|---|---|---|---|")
    for name, model, prompts, params, rows in (
            ("gqa6 decode steps", gqa6, work.prompts, [hf_paged.SamplingParams(max_new_tokens=w)
                                                       for w in work.max_new_tokens], lambda n: True),
            ("51M, 32-row decode steps", llama51, prompts51, [hf_paged.SamplingParams(max_new_tokens=48)] * 32,
             lambda n: n == 32)):
        calls = _in_step(model, prompts, params, rows)
        total = {"all": [0.0, 0.0], "head": [0.0, 0.0]}
        for (fn, shape, m), times in calls.items():
            weight, x = torch.randn(*shape), torch.randn(m, shape[1])
            module = torch.nn.Linear(shape[1], shape[0], bias=False)
            module.weight.data = weight
            run = lean_forward._head if fn == "_head" else lean_forward._linear
            alone = _cpu_ms(lambda run=run, module=module, x=x: run(module, x), 20 if fn == "_linear" else 5) * 1e-3
            for key in ("all", "head") if fn == "_head" else ("all",):
                total[key][0] += sum(times) * 1e-9
                total[key][1] += alone * len(times)
        count = sum(len(t) for t in calls.values())
        head_ratio = total["head"][0] / total["head"][1] if total["head"][1] else float("nan")
        print(f"| {name} | {count} | {total['all'][0]:.3f} | {total['all'][1]:.3f} | "
              f"{total['all'][0] / total['all'][1]:.2f} | {head_ratio:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="head,merged,instep")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{machine()}; load average {os.getloadavg()[0]:.1f}\n")
    parts = {"head": head_part, "merged": merged_part, "instep": instep_part}
    with torch.inference_mode():
        for part in args.parts.split(","):
            parts[part]()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
