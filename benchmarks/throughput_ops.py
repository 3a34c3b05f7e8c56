"""Where the timed `generate_batch` of `benchmarks/throughput.py` spends its time, op by op, without a sampler.

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/throughput_ops.py [--workload gqa6]

py-spy's native unwinding falls behind on a loaded machine (on 2026-12-05, load ~9, 94 of 20,817 samples of a gqa6
run kept their Python frames), so this times the lean forward's pieces directly: thread CPU time of each
`_linear`, `_head`, `_rms_norm`, `_rope` call and of the attention (`attend_packed`; inside it, the numba kernel
launch, the key/value store and the torch plan of long prefill chunks), per kind of step: prefill (a step with a
prompt chunk; its decode rows ride along) or decode (every row samples). The rest of each forward (embedding,
rotary tables, SiLU, residual adds, gate * up, views) is the forward's time less those; outside the forward:
scheduling, step inputs, sampling, appending. Each timer costs a clock read (~1 us in this VM) per call.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_PAGED_JIT", "now")

import hf_paged
from benchmarks.common import machine
from benchmarks.throughput import workload_and_model
from hf_paged.batching import lean_forward, model_runner
from hf_paged.cache import block_layer
from hf_paged.cache.kernels import cpu_launch

TOP = ("_linear", "_head", "_rms_norm", "_rope", "attention")
INSIDE_ATTENTION = ("numba kernel", "key/value store", "torch plan (long chunks)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["default", "gqa6"], default="gqa6")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work, model = workload_and_model(args.workload)
    spent: dict = collections.defaultdict(lambda: [0, 0])  # (kind of step, what) -> [ns, calls]
    state = {"kind": None}

    def timed(what, fn):
        def call(*a, **k):
            if state["kind"] is None:
                return fn(*a, **k)
            start = time.thread_time_ns()
            out = fn(*a, **k)
            entry = spent[state["kind"], what]
            entry[0] += time.thread_time_ns() - start
            entry[1] += 1
            return out
        return call

    forward = model_runner.ModelRunner.forward

    def step(self, input_ids, positions, metadata, logits_rows):
        state["kind"] = "prefill" if len(input_ids) > len(logits_rows) else "decode"
        spent[state["kind"], "tokens"][0] += len(input_ids)
        try:
            return timed("forward", forward)(self, input_ids, positions, metadata, logits_rows)
        finally:
            state["kind"] = None

    patches = [(lean_forward, name, timed(name, getattr(lean_forward, name))) for name in TOP[:4]]
    patches += [(model_runner, "attend_packed", timed("attention", model_runner.attend_packed)),
                (cpu_launch.CpuLaunch, "run", timed("numba kernel", cpu_launch.CpuLaunch.run)),
                (block_layer.BlockLayer, "update_packed",
                 timed("key/value store", block_layer.BlockLayer.update_packed)),
                (cpu_launch, "run_attention_plan", timed("torch plan (long chunks)", cpu_launch.run_attention_plan)),
                (model_runner.ModelRunner, "forward", step)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    params = [hf_paged.SamplingParams(max_new_tokens=w) for w in work.max_new_tokens]
    hf_paged.wrap(model, hf_paged.PagedConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=64))
    try:
        model.generate_batch(work.prompts[:2], sampling_params=params[:2])  # warm-up, untimed
        for owner, name, fn in patches:
            setattr(owner, name, fn)
        faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        model.generate_batch(work.prompts, sampling_params=params)
        cpu = time.process_time() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        hf_paged.unwrap(model)
    print(f"{machine()}; workload {args.workload}; timed run {cpu:.2f} s CPU, {faults} minor page faults, load "
          f"average {os.getloadavg()[0]:.1f}\n")
    print("| step kind | what | CPU s | share of the run | calls | us a token |\n|---|---|---|---|---|---|")
    in_forward = 0
    for kind in ("prefill", "decode"):
        total, calls = spent[kind, "forward"]
        tokens = spent[kind, "tokens"][0]
        in_forward += total

        def row(what, ns, n, kind=kind, tokens=tokens):
            print(f"| {kind} | {what} | {ns / 1e9:.3f} | {100 * ns / 1e9 / cpu:.1f}% | {n} | {ns / 1e3 / tokens:.1f} |")

        row(f"the forward ({calls} steps, {tokens} tokens)", total, calls)
        for what in TOP:
            row(what, *spent[kind, what])
            if what == "attention":
                for inner in INSIDE_ATTENTION:
                    row(f"- {inner}", *spent[kind, inner])
        row("the rest of the forward", total - sum(spent[kind, what][0] for what in TOP), calls)
    print(f"| both | outside the forward (scheduling, inputs, sampling) | {cpu - in_forward / 1e9:.3f} | "
          f"{100 * (cpu - in_forward / 1e9) / cpu:.1f}% | | |")


if __name__ == "__main__":
    main()
