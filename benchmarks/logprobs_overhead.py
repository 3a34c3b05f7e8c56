"""What `SamplingParams.logprobs` costs a decode step, and what it costs the rows that do not ask.

Two measurements, interleaved A/B pairs, CPU time (`time.process_time`), one torch thread:
  sampler  the engine's `Sampler` on 32 greedy rows of [32, vocab] logits (GPT-2's 50,257 by default): none asks
           vs one row asks for k alternatives; the tokens of the 31 others are checked identical
  step     32 requests decoding on the embedded model: a whole `Engine.step` with none asking vs one asking

    OMP_NUM_THREADS=1 python benchmarks/logprobs_overhead.py --pairs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from hf_paged import Engine, PagedConfig, SamplingParams, default_model
from hf_paged.batching.request import Request
from hf_paged.batching.sampler import Sampler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine


def sampler_pair(vocab: int, k: int, reps: int, seed: int) -> tuple[float, float]:
    """CPU seconds of `reps` sampler calls without, then with, one asking row (same logits)."""
    logits = torch.randn(32, vocab, generator=torch.Generator().manual_seed(seed))
    plain = [Request(f"r{i}", [1, 2], SamplingParams(max_new_tokens=4)) for i in range(32)]
    asking = list(plain)
    asking[7] = Request("r7", [1, 2], SamplingParams(max_new_tokens=4, logprobs=k))
    sampler = Sampler()
    times = []
    tokens = []
    for requests in (plain, asking):
        start = time.process_time()
        with torch.inference_mode():
            for _ in range(reps):
                out = sampler(requests, logits)
        times.append((time.process_time() - start) / reps)
        tokens.append(out.token_ids)
    assert tokens[0] == tokens[1], "asking for logprobs changed a token"
    return times[0], times[1]


def step_pair(engine: Engine, prompts: list[list[int]], k: int, steps: int, asking: bool) -> float:
    """CPU seconds per decode step of 32 requests (one asking when `asking`), after their prefills."""
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=steps + 4,
                                                logprobs=k if asking and i == 0 else None))
           for i, p in enumerate(prompts)]
    while any(engine.requests[r].num_computed_tokens < len(engine.requests[r].prompt_ids) for r in ids):
        engine.step()
    start = time.process_time()
    for _ in range(steps):
        engine.step()
    elapsed = (time.process_time() - start) / steps
    for rid in ids:
        engine.abort(rid)
        engine.pop_output(rid)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)

    ratios, base, extra = [], [], []
    for pair in range(args.pairs):
        a, b = sampler_pair(args.vocab, args.k, args.reps, pair)
        ratios.append(b / a)
        base.append(a)
        extra.append(b - a)
    print(f"sampler, 32 rows x {args.vocab}: none asks {statistics.median(base) * 1e3:.3f} ms, one asks (k={args.k}) "
          f"+{statistics.median(extra) * 1e3:.3f} ms; with/without median {statistics.median(ratios):.3f} "
          f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)})")

    model = default_model().model
    engine = Engine(model, PagedConfig(block_size=16, num_blocks=512))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (int(n),), generator=g).tolist() for n in torch.randint(16, 64, (32,), generator=g)]
    step_pair(engine, prompts, args.k, 2, False)  # warm-up
    ratios, base = [], []
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        got = {asking: step_pair(engine, prompts, args.k, args.steps, asking) for asking in order}
        ratios.append(got[True] / got[False])
        base.append(got[False])
    print(f"engine decode step, 32 requests (embedded model, vocab {engine.vocab_size}): none asks "
          f"{statistics.median(base) * 1e3:.2f} ms; with/without median {statistics.median(ratios):.3f} "
          f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
