"""Head merging (CHAI, issue 41 point 2) on the embedded trained model: KV bytes, quality and decode speed.

Calibration: `measure_head_distances` on 8 held-out stdlib files (512 tokens), never evaluated. For each distance
threshold (total variation between heads' attention rows, `cache/head_merge_calibrate.py`), with heads of kept KV
groups merged within the same threshold ("all": CHAI's clustering, extra score savings) or only where their maps
are identical ("kept=0": `score_threshold=0`, the KV saving alone), against the unmerged model in the same run:

- kv_rel: the merged pool's bytes per block over the unmerged one's (what `PagedCache.stats()` reports; the same
  share of every allocated pool);
- scores: attention score computations per token (clusters over all layers) over layers x heads;
- top1: top-1 agreement with the unmerged model over its next 64 greedy tokens after 256-token prompts of 24 other
  held-out files, teacher-forced (each position sees the unmerged continuation); same64: share of prompts whose 64
  free-running greedy tokens are all the unmerged ones;
- ppl: perplexity (per byte: the tokenizer is byte-level) of tokens 256..511 of those 24 files, teacher-forced;
- decode CPU: per-process CPU time per decoded token (8 requests, 256-token prompts, 64 new tokens, one torch
  thread), settings interleaved, `--repeats` rounds; the ratio to the unmerged engine with the same attention code
  (merged layers always run the torch path, see below) and to the default backend.

Merged layers attend on the torch path (`head_merge_attention`); unmerged layers keep the backend's kernels (numba
on CPU in fp32). So "unmerged, torch" is the like-for-like baseline of the attention algorithm, "unmerged, auto" the
engine's default.

`--speed-model random55m`: the decode-speed table alone on a random ~55M Llama (hidden 384, 8 layers, 6 heads over
2 KV heads, vocabulary 50257). Random heads do not cluster meaningfully, so its merge is imposed, not calibrated
(KV head 1's three query heads follow KV head 0's, head for head, in every layer): a speed shape only.

Run: `python benchmarks/head_merge.py` (about 10 minutes on 2 shared cores); `--quick` for a smoke test.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, print_table
from benchmarks.kv_compression import ForceNext, heldout_sequences, load_model
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.head_merge_calibrate import measure_head_distances, plan_from_distances

THRESHOLDS = (0.0, 0.3, 0.5, 0.7, 0.85, 1.0)
PROMPT, NEW, TEXT = 256, 64, 512


def run(model, requests: list[tuple[list[int], SamplingParams]], **config):
    """Run the requests together; returns the outputs and the CPU seconds and tokens of all-decode steps."""
    engine = Engine(model, PagedConfig(block_size=16, max_num_batched_tokens=2048, enable_prefix_caching=False,
                                       **config))
    ids = [engine.add_request(p, s) for p, s in requests]
    cpu, tokens = 0.0, 0
    while engine.has_unfinished:
        sched = engine.scheduler
        decoding = bool(sched.running) and not sched.waiting and all(
            r.num_computed_tokens >= len(r.prompt_ids) for r in sched.running)
        start = time.process_time()
        step = engine.step()
        if decoding:
            cpu += time.process_time() - start
            tokens += sum(len(t) for t in step.new_tokens.values())
    return [engine.pop_output(i) for i in ids], cpu, tokens, engine


def greedy(model, prompts: list[list[int]], head_merge=None) -> list[list[int]]:
    outs, *_ = run(model, [(p, SamplingParams(max_new_tokens=NEW)) for p in prompts], head_merge=head_merge)
    return [o.generated_tokens for o in outs]


def forced_logits(model, sequences: list[list[int]], prefill: int, head_merge=None) -> torch.Tensor:
    """Logits of positions prefill-1 .. len-2 of each sequence, the tokens forced to the sequence's own."""
    requests = [(s[:prefill], SamplingParams(max_new_tokens=len(s) - prefill, output_logits=True,
                                             logits_processors=[ForceNext(s)])) for s in sequences]
    outs, *_ = run(model, requests, head_merge=head_merge)
    return torch.cat([torch.stack(o.logits) for o in outs]).float()


def quality_table(model, distances: torch.Tensor, evals: list[list[int]], quick: bool) -> tuple[list, dict]:
    prompts = [s[:PROMPT] for s in evals]
    base_greedy = greedy(model, prompts)
    forced = [p + g for p, g in zip(prompts, base_greedy)]
    base_top = forced_logits(model, forced, PROMPT).argmax(-1)
    targets = torch.cat([torch.tensor(s[PROMPT:]) for s in evals])
    base_nll = float(torch.nn.functional.cross_entropy(forced_logits(model, evals, PROMPT), targets))
    rows, plans = [], {}
    for score_threshold in (None, 0.0):
        for threshold in THRESHOLDS[:3] if quick else THRESHOLDS:
            plan = plan_from_distances(distances, 2, threshold, score_threshold=score_threshold)
            name = f"{threshold:.2f} {'all' if score_threshold is None else 'kept=0'}"
            plans[name] = plan
            merge = plan.representatives
            top1 = float((forced_logits(model, forced, PROMPT, merge).argmax(-1) == base_top).float().mean())
            same = sum(g == b for g, b in zip(greedy(model, prompts, merge), base_greedy)) / len(prompts)
            nll = float(torch.nn.functional.cross_entropy(forced_logits(model, evals, PROMPT, merge), targets))
            rows.append([name, f"{plan.kv_fraction:.4f}", f"{plan.num_clusters / 32:.3f}", f"{top1:.4f}",
                         f"{same:.2f}", f"{math.exp(nll):.3f}", f"{math.exp(nll) / math.exp(base_nll):.4f}",
                         " ".join("".join(str(r) for r in layer) for layer in merge)])
            print(rows[-1], file=sys.stderr, flush=True)
    rows.insert(0, ["unmerged", "1.0000", "1.000", "1.0000", "1.00", f"{math.exp(base_nll):.3f}", "1.0000", "-"])
    return rows, plans


def speed_table(model, settings: dict[str, dict], prompts: list[list[int]], repeats: int) -> list:
    """CPU ms per decoded token, settings interleaved round by round."""
    per: dict[str, list[float]] = {name: [] for name in settings}
    requests = [(p, SamplingParams(max_new_tokens=NEW)) for p in prompts]
    for name, cfg in settings.items():  # warm-up (numba compile, allocator)
        run(model, requests[:2], **cfg)
    for _ in range(repeats):
        for name, cfg in settings.items():
            _, cpu, tokens, _ = run(model, requests, **cfg)
            per[name].append(1000 * cpu / tokens)
    ref_torch = statistics.median(per["unmerged, torch"])
    ref_auto = statistics.median(per["unmerged, auto"])
    rows = []
    for name, ms in per.items():
        med = statistics.median(ms)
        rows.append([name, f"{med:.3f}", f"{min(ms):.3f}-{max(ms):.3f}", f"{med / ref_torch:.3f}",
                     f"{med / ref_auto:.3f}"])
    return rows


def random_55m():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50257, hidden_size=384, intermediate_size=1024,
                                         num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                                         max_position_embeddings=2048)).eval()
    model.generation_config.eos_token_id = None
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--speed-model", choices=["default", "random55m"], default="default")
    parser.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lines = [f"machine: {machine()}", f"command: python benchmarks/head_merge.py {' '.join(sys.argv[1:])}"]
    if args.speed_model == "random55m":
        model = random_55m()
        reps = (0, 1, 2, 0, 1, 2)  # KV head 1's query heads follow KV head 0's, head for head
        merge = (reps,) * 8
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(3, 50000, (PROMPT,), generator=g).tolist() for _ in range(4 if args.quick else 8)]
        settings = {"unmerged, auto": {}, "unmerged, torch": {"attention_backend": "torch"},
                    "merged (kv_rel 0.75)": {"head_merge": merge}}
        rows = speed_table(model, settings, prompts, 1 if args.quick else args.repeats)
        lines.append(print_table(["setting", "decode CPU ms/token (median)", "min-max", "vs unmerged torch",
                                  "vs unmerged auto"], rows, "decode speed, random 55M Llama (merge imposed)"))
    else:
        model = load_model("default")
        seqs = heldout_sequences(32, TEXT)
        calib, evals = seqs[::4], [s for i, s in enumerate(seqs) if i % 4]
        if args.quick:
            evals = evals[:4]
        t0 = time.process_time()
        distances = measure_head_distances(model, calib)
        lines.append(f"calibration: {len(calib)} files x {TEXT} tokens, {time.process_time() - t0:.1f} s CPU; "
                     f"mean TV distance per layer (off-diagonal): "
                     + ", ".join(f"{float(d.sum() / (d.numel() - d.shape[0])):.2f}" for d in distances))
        rows, plans = quality_table(model, distances, evals, args.quick)
        lines.append(print_table(["threshold", "kv_rel", "scores", "top1", "same64", "ppl", "ppl_rel",
                                  "representatives per layer"], rows, "quality vs unmerged (teacher-forced)"))
        speed = {"unmerged, auto": {}, "unmerged, torch": {"attention_backend": "torch"}}
        for name in ("0.30 all", "0.85 kept=0", "1.00 kept=0") if not args.quick else ("0.30 all",):
            speed[f"merged {name} (kv_rel {plans[name].kv_fraction:.3f})"] = {
                "head_merge": plans[name].representatives}
        rows = speed_table(model, speed, [s[:PROMPT] for s in evals[:8]], 1 if args.quick else args.repeats)
        lines.append(print_table(["setting", "decode CPU ms/token (median)", "min-max", "vs unmerged torch",
                                  "vs unmerged auto"], rows, "decode speed, embedded model"))
    if args.out:
        Path(args.out).write_text("\n\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
