"""The fixed cost of a mixed step (issue 39): a decode-only step of n decodes vs the same step plus one prompt chunk.

On the ~60M random Llama of `benchmarks/disagg.py` (fp32, one torch thread), one `Engine` holds n requests that
decode; each case adds work to one step and the next step is decode-only again, so every mixed step has its own
decode-only neighbour (interleaved pairs, same batch, context lengths one token apart). Per case:

    fresh k        a new k-token prompt (random tokens: no prefix hit), one new token: the chunk's last row sampled
    ctx C + k      a prompt of C cached tokens (prefix hit, computed once before) + k new ones, one new token
    mid C + k      a chunk of k tokens in the middle of a prompt after C cached tokens (no row sampled): the prompt
                   is C + k + 64 tokens and the step's budget k (`max_prefill_tokens_per_step`); aborted after it
    load b         b handed-over blocks written by the KV connector beside the decodes (an `InProcessStore` holding
                   a prompt another engine prefilled; paced by `max_prefill_tokens_per_step` = 16 x b); the request
                   is aborted after the step that wrote them

Each step is timed on the stepping thread's CPU clock (`time.thread_time`) as a whole (`engine.step()`) and its
forward alone (`ModelRunner.forward`); the table gives medians over the pairs and the mixed step's extra time.

    python benchmarks/mixed_step.py [--decodes 4 8 16] [--chunks 1 4 16 64] [--contexts 512 2048] [--repeats 15]
    python benchmarks/mixed_step.py --profile 'fresh 4' --decodes 8    # torch.profiler of both steps of a pair
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.latency import stall_model
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import InProcessStore

BLOCK_SIZE = 16


@dataclass
class Case:
    kind: str  # "fresh", "ctx", "mid", "load"
    k: int  # prompt tokens of the chunk (blocks for "load")
    context: int = 0  # cached tokens before the chunk

    @property
    def name(self) -> str:
        return {"fresh": f"fresh {self.k}", "ctx": f"ctx {self.context} + {self.k}",
                "mid": f"mid {self.context} + {self.k}", "load": f"load {self.k} blocks"}[self.kind]


@dataclass
class Timings:
    step: list[float] = field(default_factory=list)  # seconds, whole step
    forward: list[float] = field(default_factory=list)  # seconds, ModelRunner.forward only


class Bench:
    """One engine with n decoding requests, its forward timed apart; a second engine prefills the handed-over
    prompts into the shared store."""

    def __init__(self, model, n: int, seed: int = 0) -> None:
        self.store = InProcessStore()
        self.engine = Engine(model, self._config(None), kv_store=self.store)
        self.source = Engine(model, self._config(None), kv_store=self.store)
        self.gen = torch.Generator().manual_seed(seed)
        self.forward_seconds = 0.0
        runner = self.engine.runner
        inner = runner.forward

        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.forward_seconds += time.thread_time() - start

        runner.forward = timed
        for _ in range(n):
            self.engine.add_request(self.tokens(64), SamplingParams(max_new_tokens=100_000))
        while any(r.num_computed_tokens < len(r.prompt_ids) for r in self.engine.requests.values()):
            self.engine.step()
        self.prefixes: dict[int, list[int]] = {}
        self.flip = False

    @staticmethod
    def _config(budget: int | None) -> PagedConfig:
        return PagedConfig(block_size=BLOCK_SIZE, num_blocks=2048, max_num_batched_tokens=4096,
                           max_prefill_tokens_per_step=budget)

    def tokens(self, n: int) -> list[int]:
        return torch.randint(3, 32000, (n,), generator=self.gen).tolist()

    def prefix(self, context: int) -> list[int]:
        """A prompt of `context` tokens in this engine's prefix cache (computed once)."""
        if context not in self.prefixes:
            self.prefixes[context] = self.tokens(context)
            rid = self.engine.add_request(self.prefixes[context], SamplingParams(max_new_tokens=1))
            while not self.engine.requests[rid].ended:
                self.engine.step()
            self.engine.pop_output(rid)
        return self.prefixes[context]

    def timed_step(self) -> tuple[float, float]:
        before, start = self.forward_seconds, time.thread_time()
        self.engine.step()
        return time.thread_time() - start, self.forward_seconds - before

    def pair(self, case: Case, decode: Timings, mixed: Timings) -> None:
        """One decode-only step and the case's mixed step, in alternating order (neither always runs first)."""
        self.flip = not self.flip
        for is_mixed in (False, True) if self.flip else (True, False):
            if not is_mixed:
                s, f = self.timed_step()
                decode.step.append(s), decode.forward.append(f)
                continue
            rid = self._add(case)
            s, f = self.timed_step()
            mixed.step.append(s), mixed.forward.append(f)
            if rid in self.engine.requests:
                request = self.engine.requests[rid]
                if not request.ended:
                    self.engine.abort(rid)
                self.engine.pop_output(rid)

    def _add(self, case: Case) -> str:
        config = self.engine.config
        if case.kind == "fresh":
            config.max_prefill_tokens_per_step = None
            return self.engine.add_request(self.tokens(case.k), SamplingParams(max_new_tokens=1))
        if case.kind == "ctx":
            config.max_prefill_tokens_per_step = None
            return self.engine.add_request(self.prefix(case.context) + self.tokens(case.k),
                                           SamplingParams(max_new_tokens=1))
        if case.kind == "mid":
            config.max_prefill_tokens_per_step = case.k
            return self.engine.add_request(self.prefix(case.context) + self.tokens(case.k + 64),
                                           SamplingParams(max_new_tokens=1))
        # load: a prompt the source engine prefilled, its blocks in the store; the step writes `k` of them
        prompt = self.tokens(case.k * BLOCK_SIZE + 1)
        rid = self.source.add_request(prompt, SamplingParams(max_new_tokens=1))
        while not self.source.requests[rid].ended:
            self.source.step()
        self.source.pop_output(rid)
        config.max_prefill_tokens_per_step = BLOCK_SIZE * case.k
        return self.engine.add_request(prompt, SamplingParams(max_new_tokens=1))


def run(model, n: int, cases: list[Case], repeats: int) -> list[list[str]]:
    bench = Bench(model, n)
    for case in cases:  # warm: prefixes cached, kernels and code paths run once
        bench.pair(case, Timings(), Timings())
    results = {case.name: (Timings(), Timings()) for case in cases}
    for _ in range(repeats):  # round robin over the cases: a drift of the machine is shared by all
        for case in cases:
            bench.pair(case, *results[case.name])
    rows = []
    for case in cases:
        decode, mixed = results[case.name]
        d_step, m_step = median(decode.step) * 1e3, median(mixed.step) * 1e3
        d_fwd, m_fwd = median(decode.forward) * 1e3, median(mixed.forward) * 1e3
        extra = median(m - d for m, d in zip(mixed.step, decode.step)) * 1e3
        extra_fwd = median(m - d for m, d in zip(mixed.forward, decode.forward)) * 1e3
        rows.append([n, case.name, f"{d_step:.1f}", f"{m_step:.1f}", f"{extra:+.1f}", f"{m_step / d_step:.2f}",
                     f"{d_fwd:.1f}", f"{m_fwd:.1f}", f"{extra_fwd:+.1f}"])
    return rows


def profile(model, n: int, case: Case) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    bench = Bench(model, n)
    for _ in range(3):
        bench.pair(case, Timings(), Timings())
    for label, mixed in (("decode-only", False), (case.name, True)):
        rid = bench._add(case) if mixed else None
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            bench.engine.step()
        print(f"--- {label} (n = {n})")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        if rid is not None and rid in bench.engine.requests:
            if not bench.engine.requests[rid].ended:
                bench.engine.abort(rid)
            bench.engine.pop_output(rid)


def parse_case(text: str) -> Case:
    kind, _, rest = text.partition(" ")
    if kind in ("ctx", "mid"):
        context, _, k = rest.partition("+")
        return Case(kind, int(k), int(context))
    return Case(kind, int(rest.split()[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decodes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--contexts", type=int, nargs="*", default=[512, 2048])
    parser.add_argument("--loads", type=int, nargs="*", default=[1, 4], help="handed-over blocks per step")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kernel-queries", type=int, default=None,
                        help="experiment: cpu_attention.MAX_KERNEL_QUERIES (longer chunks take the torch path)")
    parser.add_argument("--kernel-pairs", type=int, default=None,
                        help="experiment: cpu_attention.MAX_KERNEL_PAIRS (plain chunks of more queries x keys: torch)")
    parser.add_argument("--profile", default=None, help="a case ('fresh 4', 'ctx 512+4', 'mid 2048+4', 'load 2')")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.kernel_queries is not None:
        from hf_paged.cache.kernels import cpu_attention

        cpu_attention.MAX_KERNEL_QUERIES = args.kernel_queries
    if args.kernel_pairs is not None:
        from hf_paged.cache.kernels import cpu_attention

        cpu_attention.MAX_KERNEL_PAIRS = args.kernel_pairs
    model = stall_model()
    if args.profile:
        profile(model, args.decodes[0], parse_case(args.profile))
        return 0
    cases = ([Case("fresh", k) for k in args.chunks] + [Case("ctx", k, c) for c in args.contexts for k in args.chunks]
             + [Case("mid", k, c) for c in args.contexts for k in args.chunks] + [Case("load", b) for b in args.loads])
    load_before = os.getloadavg()[0]
    rows = [row for n in args.decodes for row in run(model, n, cases, args.repeats)]
    print_table(["decodes", "case", "decode-only step", "mixed step", "extra (paired)", "mixed / decode",
                 "decode-only forward", "mixed forward", "extra forward"], rows,
                title=f"ms of the stepping thread's CPU clock, medians of {args.repeats} interleaved pairs; {machine()}")
    print(f"load average (1 min) {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
