"""hf-paged before / after the 51M model's lm_head, score-row and certified-argmax changes, interleaved A/B on PagedLM (issue 44):
CPU time of hf_paged_gen (generate_until, `simple_evaluate`, `--limit` documents) and of `loglikelihood_rolling` on
the hf_paged_ppl documents, the random 51M Llama of `benchmarks/lm_eval.py` (GPT-2's 50,257-token vocabulary).

The changes (`--changes`, the "before" side undoes them): `head`, the lm_head in vocabulary slices
(`lean_forward._head`; before: the one matmul `_linear`); `scores`, score rows' log-softmax in place
(`score_rows.record_scores`; before: `torch.logsumexp`, a second [rows, vocab] tensor); `certified`, greedy steps
tokens from the bf16 head with a proof (`batching/certified_head.py`; before: `certified_argmax=False`, the fp32
head and the sampler's argmax). Each run builds a fresh
PagedLM (untimed); the order inside a pair alternates. Generated text and log-likelihoods must be identical.

    OMP_NUM_THREADS=1 python benchmarks/lm_eval_ab.py --pairs 3 [--tasks gen,ppl] [--changes head,scores,certified]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # not ./lm_eval*
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_PAGED_JIT", "now")

import lm_eval
from lm_eval.tasks import TaskManager

import hf_paged
from benchmarks.common import machine
from benchmarks.lm_eval import TASKS_DIR, _llama50m
from benchmarks.lm_eval_ppl_ab import _documents
from hf_paged.batching import lean_forward, prompt_logprobs
from hf_paged.integrations.lm_eval import PagedLM

SLICED, IN_PLACE = lean_forward._head, prompt_logprobs.record_scores


def _one_matmul(module, x):
    return lean_forward._linear(module, x)


def _with_logsumexp(scored, logits) -> None:
    """record_scores as it was: `torch.logsumexp` beside the gather."""
    if not scored:
        return
    starts = [rows.first - rows.request.score_start for rows in scored]
    targets: list[int] = []
    for rows, start in zip(scored, starts):
        targets.extend(rows.request.params.score_targets[start : start + rows.count])
    target = torch.tensor(targets, dtype=torch.long, device=logits.device)
    logits = logits.float()
    logprobs = (logits.gather(1, target[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)).tolist()
    greedy = (logits.argmax(dim=-1) == target).tolist()
    row = 0
    for rows, start in zip(scored, starts):
        end = row + rows.count
        rows.request.score_logprobs[start : start + rows.count] = logprobs[row:end]
        rows.request.score_greedy[start : start + rows.count] = greedy[row:end]
        row = end


def _run(side: str, changes: set[str], task: str, path: str, limit: int, tasks: TaskManager,
         documents) -> tuple[float, object, int]:
    """(CPU s, outputs, computed tokens) of one fresh PagedLM, `side` "before" or "after"."""
    before = side == "before"
    lean_forward._head = _one_matmul if before and "head" in changes else SLICED
    prompt_logprobs.record_scores = _with_logsumexp if before and "scores" in changes else IN_PLACE
    try:
        flag = {"certified_argmax": False} if before and "certified" in changes else {}
        lm = PagedLM(pretrained=path, dtype="float32", device="cpu", **flag)
        start = time.process_time()
        if task == "gen":
            out = lm_eval.simple_evaluate(model=lm, tasks=["hf_paged_gen"], task_manager=tasks, limit=limit,
                                          num_fewshot=2, log_samples=True)
            outputs = [s["resps"] for s in out["samples"]["hf_paged_gen"]]
        else:
            outputs = lm.loglikelihood_rolling(documents, disable_tqdm=True)
        return time.process_time() - start, outputs, hf_paged.engine_of(lm.model).metrics.num_computed_tokens
    finally:
        lean_forward._head, prompt_logprobs.record_scores = SLICED, IN_PLACE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--tasks", default="gen,ppl")
    parser.add_argument("--changes", default="head,scores")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    tmp = tempfile.TemporaryDirectory()
    path = _llama50m(tmp.name)
    tasks, documents = TaskManager(include_path=TASKS_DIR, metadata={"pretrained": path}), _documents()
    changes = set(args.changes.split(","))
    for task in args.tasks.split(","):
        times: dict[str, list[float]] = {"before": [], "after": []}
        ratios = []
        for i in range(args.pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            runs = {side: _run(side, changes, task, path, args.limit, tasks, documents) for side in order}
            assert runs["before"][1] == runs["after"][1], f"{task} pair {i}: the outputs differ"
            assert runs["before"][2] == runs["after"][2]
            for side, series in times.items():
                series.append(runs[side][0])
            ratios.append(runs["before"][0] / runs["after"][0])
            print(f"{task} pair {i} ({args.changes}): before {runs['before'][0]:.2f} s, after {runs['after'][0]:.2f} s,"
                  f" before / after {ratios[-1]:.3f}, {runs['before'][2]} tokens, outputs identical, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"{task} median ({args.changes}): before {statistics.median(times['before']):.2f} s, after "
              f"{statistics.median(times['after']):.2f} s; before / after per pair median "
              f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
