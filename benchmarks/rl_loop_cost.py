"""What the engine's weights check costs in an RL-style loop (rollouts with `model.generate`, a loss, an optimizer
step, again): the fingerprint per admitting step, how many checks a rollout makes, and the rollout's CPU time after
an optimizer step with the weights check before 6d5d83a (every weight change rebuilt the lean forward, whose
self-check runs probe forwards) against now (new values in the same tensors keep it). Both versions of
`batching/weights.py` run in one process, interleaved; the outputs are checked against stock generate.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/rl_loop_cost.py --rounds 6

A 100M-parameter Llama (hidden 768, 8 layers, vocabulary 32000), fp32, CPU, one torch thread; a rollout is 4 rows
(2 prompts x 2, a 96-token shared prefix + 8 tokens) x 32 new tokens, greedy.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
import hf_paged.batching.engine as engine_module
from hf_paged.batching import weights as new_weights
from hf_paged.cli.workloads import left_pad

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine

BEFORE = "6d5d83a~1"  # the commit before the fingerprint split storage from values


def old_weights_module():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = subprocess.run(["git", "-C", root, "show", f"{BEFORE}:hf_paged/batching/weights.py"],
                            capture_output=True, text=True, check=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "weights_before.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("weights_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["weights_before"] = module
    spec.loader.exec_module(module)
    return module


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                         num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
                         eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    versions = {"before": old_weights_module(), "now": new_weights}
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters in "
          f"{len(list(model.parameters()))} tensors; load {os.getloadavg()[0]:.1f}")

    fingerprint = {name: [] for name in versions}
    for _ in range(5):
        for name, module in versions.items():
            fingerprint[name].append(median_ms(lambda m=module: m.weights_fingerprint(model), 300))
    print("fingerprint, ms CPU per call (median of 300, 5 interleaved rounds):",
          {k: round(statistics.median(v), 3) for k, v in fingerprint.items()})

    g = torch.Generator().manual_seed(1)
    system = torch.randint(3, 32000, (96,), generator=g).tolist()
    prompts = [system + torch.randint(3, 32000, (8,), generator=g).tolist() for _ in range(2)]
    ids, mask = left_pad([prompts[0], prompts[0], prompts[1], prompts[1]], 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    checks = {"n": 0}
    rollout = {name: [] for name in versions}
    for r in range(args.rounds + 1):
        order = list(versions.items()) if r % 2 == 0 else list(versions.items())[::-1]
        for name, module in order:
            def counted(m, fn=module.weights_fingerprint):
                checks["n"] += 1
                return fn(m)
            engine_module.weights_fingerprint = counted
            hf_paged.wrap(model, block_size=16)
            out = model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False)  # warm engine
            model.train()
            model(out, labels=out).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            model.eval()
            before_checks, start = checks["n"], time.process_time()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False)
            seconds = time.process_time() - start
            assert torch.equal(out, type(model).generate(model, ids, attention_mask=mask, max_new_tokens=32,
                                                         do_sample=False)), name
            if r > 0:  # (round 0 warms both up)
                rollout[name].append(seconds * 1e3)
            hf_paged.unwrap(model)
    print(f"weights checks per rollout: {checks['n'] - before_checks}")
    print("rollout after an optimizer step, ms CPU:", {k: [round(x) for x in v] for k, v in rollout.items()})
    ratios = [n / b for n, b in zip(rollout["now"], rollout["before"], strict=True)]
    print(f"now/before per round: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
          f"{max(ratios):.3f}); medians {({k: round(statistics.median(v)) for k, v in rollout.items()})}; "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
