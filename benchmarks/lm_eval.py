"""lm-evaluation-harness: its `hf` backend at batch 1, 8 and 32 vs `hf-paged` (PagedLM), and lm-eval's own `HFLM`
over a wrapped model, on hf_paged's local tasks, side by side in one process.

Per task and side: lm-eval's metric values, process CPU time of `simple_evaluate` (every thread), wall time, and the
tokens the model computed (hf: the input_ids of every forward, padding and decode steps included; hf-paged: the
engine's computed tokens, prefix-cache hits excluded). Every sample is compared with hf at batch 8: generated text
identical, log-likelihoods within 1e-4 (relative 1e-6 for document sums, which hf adds in fp32).

Tasks (hf_paged/assets/lm_eval_tasks, documents sized in the model's own tokens): hf_paged_gen (generate_until, a
passage and question of 50-1,500 tokens after 2 short few-shot examples (the first documents, the same before every
document, as MMLU's and GSM8K's prompts), up to 128 new tokens, until "\\n"), hf_paged_mc (4 choices of 10-40
tokens after 300-800-token passages), hf_paged_ppl (passages of 1,000-6,000 characters, rolling windows). Models: the embedded byte-level tiny
Llama, and a random Llama of ~50M parameters with GPT-2's 50,257-token vocabulary (`--model llama50m`; needs
../shared/data/tokenizers/gpt2).

    python benchmarks/lm_eval.py --model tiny --limit 48 --out benchmarks/lm_eval_results.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# run as a script, this file's folder comes first on sys.path and its name would shadow the lm_eval package
sys.path[:] = [os.path.dirname(HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != HERE]
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_PAGED_JIT", "now")  # kernels compiled before the first measurement (benchmarks/common.py)

import lm_eval
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

import hf_paged
from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.integrations.lm_eval import PagedLM

TASKS_DIR = str(DEFAULT_MODEL_PATH.parent / "lm_eval_tasks")
TASKS = {"hf_paged_gen": 2, "hf_paged_mc": 0, "hf_paged_ppl": 0}  # task -> num_fewshot
GPT2 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                    "tokenizers", "gpt2")


def _llama50m(directory: str) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(GPT2)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class _Counter:
    """Tokens in the input_ids of every forward of a model (padding included)."""

    def __init__(self, model) -> None:
        self.tokens = 0
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.tokens += ids.numel()


def _side(name: str, path: str):
    """A fresh LM (no cache carried from an earlier measurement) and a function giving its computed tokens."""
    if name == "hf-paged":
        lm = PagedLM(pretrained=path, dtype="float32", device="cpu")
        engine = hf_paged.engine_of(lm.model)
        return lm, lambda: engine.metrics.num_computed_tokens
    if name == "hf-wrapped":
        lm = HFLM(pretrained=path, dtype="float32", device="cpu", batch_size=8)
        hf_paged.wrap(lm.model)
        counter = _Counter(lm.model)  # the engine's packed forwards and lm-eval's own (loglikelihood) alike
        return lm, lambda: counter.tokens
    batch = int(name.split("b")[-1])
    lm = HFLM(pretrained=path, dtype="float32", device="cpu", batch_size=batch)
    counter = _Counter(lm.model)
    return lm, lambda: counter.tokens


def _run(name: str, path: str, task: str, limit: int, tasks: TaskManager) -> dict:
    lm, computed = _side(name, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", hf_paged.PagedFallbackWarning)
        start, start_cpu = time.perf_counter(), time.process_time()
        out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=tasks,
                                      limit=limit, num_fewshot=TASKS[task], log_samples=True)
        wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    fallbacks = sum(issubclass(w.category, hf_paged.PagedFallbackWarning) for w in caught)
    metrics = {k: v for k, v in out["results"][task].items() if "," in k and "stderr" not in k}
    return {"cpu": cpu, "wall": wall, "tokens": computed(), "metrics": metrics, "samples": out["samples"][task],
            "fallbacks": fallbacks}


def _same(a: list, b: list) -> tuple[int, int]:
    """(samples equal, samples) between two sides."""
    equal = 0
    for x, y in zip(a, b, strict=True):
        ok = True
        for rx, ry in zip(x["resps"], y["resps"], strict=True):
            rx, ry = rx[0], ry[0]
            if isinstance(rx, str):
                ok &= rx == ry
            elif isinstance(rx, float):
                ok &= abs(rx - ry) <= max(1e-4, 1e-6 * abs(ry))
            else:
                ok &= abs(rx[0] - ry[0]) <= 1e-4 and rx[1] == ry[1]
        equal += ok
    return equal, len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=("tiny", "llama50m"))
    parser.add_argument("--limit", type=int, default=48)
    parser.add_argument("--sides", default="hf-b1,hf-b8,hf-b32,hf-paged,hf-wrapped")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time unaffected by spinning "
                                                                   "OpenMP workers on a shared machine)")
    parser.add_argument("--out", default=None, help="append the markdown table to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    path = str(DEFAULT_MODEL_PATH) if args.model == "tiny" else _llama50m(tmp.name)
    sides = args.sides.split(",")
    # (indexing lm-eval's thousands of task files: once, not timed); `pretrained` sizes the documents in this
    # model's tokens, as `hf-paged eval --model_args pretrained=...` does (`paged_tasks`)
    tasks = TaskManager(include_path=TASKS_DIR, metadata={"pretrained": path})
    lines = [f"### {args.model}: {args.limit} documents per task",
             "",
             (f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs (load average at "
             f"start {os.getloadavg()[0]:.1f}), torch {torch.__version__} ({torch.get_num_threads()} threads), "
             f"lm-eval {lm_eval.__version__}. Command: `python benchmarks/lm_eval.py {' '.join(sys.argv[1:])}`."),
             "",
             "| task | side | CPU s | wall s | tokens computed | metrics | samples equal to hf b8 | fallbacks |",
             "|---|---|---|---|---|---|---|---|"]
    summary = []
    for task in args.tasks.split(","):
        results = {}
        for side in sides:  # the hf sides first: hf b8 is the reference
            results[side] = _run(side, path, task, args.limit, tasks)
            print(task, side, f"cpu {results[side]['cpu']:.1f}s", results[side]["metrics"], flush=True)
        reference = results.get("hf-b8") or next(iter(results.values()))
        hf_sides = [s for s in sides if s.startswith("hf-b")]
        best = min(hf_sides, key=lambda s: results[s]["cpu"]) if hf_sides else None
        for side in sides:
            r = results[side]
            equal, total = _same(r["samples"], reference["samples"])
            metrics = ", ".join(f"{k.split(',')[0]} {v:.4g}" for k, v in r["metrics"].items())
            lines.append(f"| {task} | {side} | {r['cpu']:.1f} | {r['wall']:.1f} | {r['tokens']} | {metrics} | "
                         f"{equal}/{total} | {r['fallbacks']} |")
        if best is not None and "hf-paged" in results:
            ours = results["hf-paged"]
            summary.append(f"| {task} | {best} | {results[best]['cpu'] / ours['cpu']:.2f}x | "
                           f"{ours['tokens'] / results[best]['tokens']:.2f}x |")
    lines += ["", "hf-paged against the fastest hf batch size (CPU time):", "",
              "| task | fastest hf | speed-up (CPU) | tokens computed, ours / theirs |", "|---|---|---|---|",
              *summary, ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
