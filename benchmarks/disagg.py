"""Prefill/decode disaggregation vs colocated replicas (issue 39): TTFT and inter-token latency under a mixed load.

A smaller run of the issue's measure, as a replay with measured costs: every replica is a real `Engine` (the ~60M
random Llama of `benchmarks/latency.py`, fp32, one torch thread), stepped in this process; each replica has its own
clock, advanced by the CPU time (`time.process_time`) of its own steps, so the replicas run "in parallel" as on one
core each, whatever else the machine runs. Requests arrive on those clocks; a token's time is the clock of the
replica that produced it after that step.

Load: short requests (64-token prompts, 48 new tokens) arriving every `--gap` seconds, and long prompts (1-2k
tokens, 8 new tokens) arriving while they decode. Three setups of 2 replicas:

  colocated              requests alternate between the replicas; each prefills and decodes
  colocated, chunked     the same with `max_prefill_tokens_per_step` (a long prefill cut into chunks between decodes)
  1 prefill + 1 decode   every request is prefilled (1 token) on the prefill replica, its blocks handed over through
                         a store, then decoded on the decode replica, which loads them (its own measured step time),
                         from the moment the prefill finished on the prefill replica's clock

The hand-over here is an `InProcessStore` (same process); the object store's own cost per block is measured in
`benchmarks/kv_transfer_results.md` (Ray object store row). Greedy tokens of every request are checked equal across
the three setups.

    python benchmarks/disagg.py [--shorts 8] [--longs 4] [--out benchmarks/disagg_results.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.latency import stall_model as build_model
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import InProcessStore

BLOCK_SIZE = 16


@dataclass
class Arrival:
    at: float  # seconds on the receiving replica's clock
    prompt: list[int]
    max_new: int
    kind: str  # "short" / "long"
    times: list[float] = field(default_factory=list)  # each token's time
    tokens: list[int] = field(default_factory=list)


class Replica:
    """An engine with its own clock (CPU seconds of its own steps)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.clock = engine, 0.0
        self.pending: list[tuple[float, Arrival, int | None]] = []  # (time, request, max_new), not yet admitted
        self.live: dict[str, Arrival] = {}
        self.done: list[Arrival] = []

    def submit(self, arrival: Arrival, at: float, max_new: int | None = None) -> None:
        self.pending.append((at, arrival, max_new))
        self.pending.sort(key=lambda x: x[0])

    def next_event(self) -> float | None:
        if self.live:
            return self.clock
        return max(self.clock, self.pending[0][0]) if self.pending else None

    def step(self) -> None:
        if not self.live and self.pending:
            self.clock = max(self.clock, self.pending[0][0])
        while self.pending and self.pending[0][0] <= self.clock:
            _, arrival, max_new = self.pending.pop(0)
            rid = self.engine.add_request(arrival.prompt, SamplingParams(max_new_tokens=max_new or arrival.max_new))
            self.live[rid] = arrival
        start = time.process_time()
        self.engine.step()
        self.clock += time.process_time() - start
        for rid in list(self.live):
            request = self.engine.requests[rid]
            arrival = self.live[rid]
            new = request.output_ids[len(arrival.tokens):]
            arrival.tokens += list(new)
            arrival.times += [self.clock] * len(new)
            if request.ended:
                self.engine.pop_output(rid)
                del self.live[rid]
                self.done.append(arrival)


def workload(args) -> list[Arrival]:
    g = torch.Generator().manual_seed(args.seed)
    out = []
    for i in range(args.shorts):
        out.append(Arrival(i * args.gap, torch.randint(3, 32000, (64,), generator=g).tolist(), 48, "short"))
    for i in range(args.longs):
        n = 1024 + (i * 1024) // max(args.longs - 1, 1)
        at = (i + 0.5) * args.shorts * args.gap / args.longs
        out.append(Arrival(at, torch.randint(3, 32000, (n,), generator=g).tolist(), 8, "long"))
    return sorted(out, key=lambda a: a.at)


def fresh(arrivals: list[Arrival]) -> list[Arrival]:
    return [Arrival(a.at, a.prompt, a.max_new, a.kind) for a in arrivals]


def config(**overrides) -> PagedConfig:
    return PagedConfig(**{"block_size": BLOCK_SIZE, "num_blocks": 1024, "max_num_batched_tokens": 2048, **overrides})


def run_until_done(replicas: list[Replica], on_step=None) -> None:
    while True:
        events = [(r.next_event(), i) for i, r in enumerate(replicas)]
        events = [(t, i) for t, i in events if t is not None]
        if not events:
            return
        _, i = min(events)
        replicas[i].step()
        if on_step is not None:
            on_step(replicas[i])


def colocated(model, arrivals: list[Arrival], **cfg) -> list[Arrival]:
    replicas = [Replica(Engine(model, config(**cfg))) for _ in range(2)]
    for i, a in enumerate(arrivals):
        replicas[i % 2].submit(a, a.at)
    run_until_done(replicas)
    return arrivals


def disaggregated(model, arrivals: list[Arrival]) -> tuple[list[Arrival], dict]:
    store = InProcessStore()
    prefill = Replica(Engine(model, config(), kv_store=store))
    decode = Replica(Engine(model, config(), kv_store=store))
    handed: dict[int, Arrival] = {}
    shadows = []
    for a in arrivals:
        shadow = Arrival(a.at, a.prompt, 1, a.kind)  # the prefill's own record (one token)
        handed[id(shadow)] = a
        shadows.append(shadow)
        prefill.submit(shadow, a.at)

    def hand_over(replica: Replica) -> None:
        if replica is prefill:
            while prefill.done:
                shadow = prefill.done.pop()
                decode.submit(handed[id(shadow)], prefill.clock)  # decodes from the prefill's end on

    run_until_done([prefill, decode], hand_over)
    stats = {k: v for k, v in decode.engine.stats().items() if k.startswith("kv_transfer_")}
    return arrivals, stats


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def summarize(arrivals: list[Arrival]) -> dict[str, float]:
    ttft = [a.times[0] - a.at for a in arrivals]
    gaps = [b - a for r in arrivals if r.kind == "short" for a, b in zip(r.times, r.times[1:])]
    return {"ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99), "itl_p50": pct(gaps, 0.5),
            "itl_p99": pct(gaps, 0.99), "itl_max": max(gaps)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shorts", type=int, default=8)
    parser.add_argument("--longs", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between short arrivals")
    parser.add_argument("--chunk", type=int, default=256, help="max_prefill_tokens_per_step of the chunked setup")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    model = build_model()
    base = workload(args)
    warm = Engine(model, config())
    warm.run([warm.add_request(base[0].prompt, SamplingParams(max_new_tokens=2))])  # kernels loaded, allocator primed

    results = {
        "colocated x2": summarize(colocated(model, (reference_run := fresh(base)))),
        "colocated x2, chunked": summarize(colocated(model, (chunked := fresh(base)),
                                                     max_prefill_tokens_per_step=args.chunk)),
    }
    pd, transfer = disaggregated(model, (pd_arrivals := fresh(base)))
    results["1 prefill + 1 decode"] = summarize(pd)
    reference = [a.tokens for a in reference_run]
    assert [a.tokens for a in chunked] == reference and [a.tokens for a in pd_arrivals] == reference

    rows = [[name, *(f"{r[k] * 1000:.0f}" for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "itl_max")),
             f"{r['itl_p99'] / r['itl_p50']:.2f}"] for name, r in results.items()]
    title = (f"{args.shorts} short requests (64-token prompts, 48 new tokens, one every {args.gap} s) and {args.longs} "
             "long prompts (1-2k tokens, 8 new) arriving among them; 2 replicas, ~60M random Llama, fp32, block size "
             f"{BLOCK_SIZE}; milliseconds on each replica's own CPU clock:")
    table = print_table(["setup", "TTFT p50", "TTFT p99", "inter-token p50 (short)", "inter-token p99 (short)",
                         "inter-token max", "p99 / p50"], rows, title=title)
    colo = results["colocated x2"]
    pdr = results["1 prefill + 1 decode"]
    verdict = (f"Targets (issue 39): PD decode inter-token p99 <= 1.5x its p50: {pdr['itl_p99'] / pdr['itl_p50']:.2f}x; "
               f"PD TTFT p99 <= 1.5x colocated: {pdr['ttft_p99'] / colo['ttft_p99']:.2f}x. The decode replica loaded "
               f"{transfer['kv_transfer_loaded_blocks']} blocks ({transfer['kv_transfer_loaded_bytes'] / 2**20:.1f} MiB, "
               f"{(transfer['kv_transfer_fetch_seconds'] + transfer['kv_transfer_load_seconds']) * 1000:.0f} ms of "
               "reads and copies) instead of recomputing them; every request's greedy tokens are the same in the "
               "three setups.")
    notes = ("Not measured here (left from the issue's list): the live Ray Serve deployment under load (this machine's "
             "2 cores are shared by ~9 agents: wall-clock latencies of 3+ Ray processes would measure the others), "
             "the 2,000-request soak with disconnects and a killed prefill replica (the kill and the disconnect are "
             "tested in tests/scaleout/test_disagg.py). Load average (1 min) of the machine: "
             f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (per-process CPU clocks make the "
             "replay independent of it, up to cache effects).")
    print(verdict)
    print(notes)
    if args.out:
        command = (f"python benchmarks/disagg.py --shorts {args.shorts} --longs {args.longs} --gap {args.gap} "
                   f"--chunk {args.chunk} --out {args.out}")
        args.out.write_text(f"# Prefill/decode disaggregation vs colocated replicas\n\n`{command}` on {machine()}.\n\n"
                            f"{table}\n\n{verdict}\n\n{notes}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
