"""Prefill/decode disaggregation vs colocated replicas (issue 39): TTFT and inter-token latency under mixed loads.

A smaller run of the issue's measure, as a replay with measured costs: every replica is a real `Engine` (the ~60M
random Llama of `benchmarks/latency.py`, fp32, one torch thread), stepped in this process; each replica has its own
clock, advanced by the CPU time (`time.process_time`) of its own steps, so the replicas run "in parallel" as on one
core each, whatever else the machine runs. Requests arrive on those clocks; a token's time is the clock of the
replica that produced it after that step.

Load: short requests (`--short-len`-token prompts, 48 new tokens) arriving every `--gap` seconds, and long prompts
(`--long-len` to 2x that, 8 new tokens) arriving while they decode. Four setups of 2 replicas:

  colocated              requests alternate between the replicas; each prefills and decodes
  colocated, chunked     the same with `max_prefill_tokens_per_step` (a long prefill cut into chunks between decodes)
  1 prefill + 1 decode   every request is prefilled (1 token) on the prefill replica, its blocks handed over through
                         a store, then decoded on the decode replica, which loads them (its own measured step time),
                         from the moment the prefill finished on the prefill replica's clock
  PD, placed             the same, but each prompt's side is decided on arrival by the gateway's own rule
                         (`hf_paged.scaleout.pd_placement.PlacementLedger`, the object `DisaggGateway` uses): the
                         prefill replica, or a local prefill on the decode replica in chunks of `--decode-budget`
                         (its `max_prefill_tokens_per_step`; with `--decode-ratio`, also its
                         `max_prefill_step_time_ratio`: a step's chunk and block writes sized by its measured step
                         times); a placement is released when the prefill replica finishes it, or when the decode
                         replica emits its first token; `--drain` also tells the ledger the decode side's step time

The gateway's view is modelled on the replay's clock: a release counts for a decision only once its time has come.
The hand-over here is an `InProcessStore` (same process); the object store's own cost per block is measured in
`benchmarks/kv_transfer_results.md` (Ray object store row). Greedy tokens of every request are checked equal across
the setups.

    python benchmarks/disagg.py [--shorts 8] [--longs 4] [--gap 0.25] [--seeds 0 1 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.latency import stall_model as build_model
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import InProcessStore
from hf_paged.scaleout.pd_placement import Placement, PlacementLedger, Side

BLOCK_SIZE = 16
SETUPS = ("colocated x2", "colocated x2, chunked", "1 prefill + 1 decode", "PD, placed")


@dataclass
class Arrival:
    at: float  # seconds on the receiving replica's clock
    prompt: list[int]
    max_new: int
    kind: str  # "short" / "long"
    times: list[float] = field(default_factory=list)  # each token's time
    tokens: list[int] = field(default_factory=list)
    side: str = ""  # where it was prefilled (PD setups)
    started: float | None = None  # clock of the replica that prefilled it, when the first step computing it began
    prefilled: float | None = None  # the prefill replica's clock when it finished the prompt (handed over)


class Replica:
    """An engine with its own clock (CPU seconds of its own steps)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.clock = engine, 0.0
        self.pending: list[tuple[float, Arrival, int | None]] = []  # (time, request, max_new), not yet admitted
        self.live: dict[str, Arrival] = {}
        self.done: list[Arrival] = []
        self.steps: list[tuple[float, float]] = []  # (clock at its end, CPU seconds) of each step

    def submit(self, arrival: Arrival, at: float, max_new: int | None = None) -> None:
        self.pending.append((at, arrival, max_new))
        self.pending.sort(key=lambda x: x[0])

    def next_event(self) -> float | None:
        if self.live:
            return self.clock
        return max(self.clock, self.pending[0][0]) if self.pending else None

    def step(self) -> list[Arrival]:
        """One engine step; returns the requests that got their first token in it."""
        if not self.live and self.pending:
            self.clock = max(self.clock, self.pending[0][0])
        while self.pending and self.pending[0][0] <= self.clock:
            _, arrival, max_new = self.pending.pop(0)
            rid = self.engine.add_request(arrival.prompt, SamplingParams(max_new_tokens=max_new or arrival.max_new))
            self.live[rid] = arrival
        start, began = time.process_time(), self.clock
        self.engine.step()
        self.clock += time.process_time() - start
        self.steps.append((self.clock, self.clock - began))
        first = []
        for rid in list(self.live):
            request = self.engine.requests[rid]
            arrival = self.live[rid]
            if arrival.started is None and request.num_computed_tokens > 0:
                arrival.started = began
            new = request.output_ids[len(arrival.tokens):]
            if new and not arrival.tokens:
                first.append(arrival)
            arrival.tokens += list(new)
            arrival.times += [self.clock] * len(new)
            if request.ended:
                self.engine.pop_output(rid)
                del self.live[rid]
                self.done.append(arrival)
        return first


def workload(args, seed: int) -> list[Arrival]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(args.shorts):
        out.append(Arrival(i * args.gap, torch.randint(3, 32000, (args.short_len,), generator=g).tolist(), 48,
                           "short"))
    for i in range(args.longs):
        n = args.long_len + (i * args.long_len) // max(args.longs - 1, 1)
        at = (i + 0.5) * args.shorts * args.gap / args.longs
        out.append(Arrival(at, torch.randint(3, 32000, (n,), generator=g).tolist(), 8, "long"))
    return sorted(out, key=lambda a: a.at)


def fresh(arrivals: list[Arrival]) -> list[Arrival]:
    return [Arrival(a.at, a.prompt, a.max_new, a.kind) for a in arrivals]


def config(**overrides) -> PagedConfig:
    return PagedConfig(**{"block_size": BLOCK_SIZE, "num_blocks": 1024, "max_num_batched_tokens": 2048, **overrides})


def run_until_done(replicas: list[Replica], on_step=None, arrivals: list[Arrival] = (), on_arrival=None) -> None:
    """Step the replica whose next event comes first; an arrival is handled once every replica's clock reached it."""
    incoming = sorted(arrivals, key=lambda a: a.at)
    while True:
        events = [(t, i) for i, r in enumerate(replicas) if (t := r.next_event()) is not None]
        if incoming and (not events or incoming[0].at <= min(events)[0]):
            on_arrival(incoming.pop(0))
            continue
        if not events:
            return
        _, i = min(events)
        first = replicas[i].step()
        if on_step is not None:
            on_step(replicas[i], first)


def colocated(model, arrivals: list[Arrival], **cfg) -> list[Arrival]:
    replicas = [Replica(Engine(model, config(**cfg))) for _ in range(2)]
    for i, a in enumerate(arrivals):
        replicas[i % 2].submit(a, a.at)
    run_until_done(replicas)
    return arrivals


def disaggregated(model, arrivals: list[Arrival], ledger: PlacementLedger | None = None, drain: bool = False,
                  **cfg) -> tuple[list[Arrival], dict]:
    """1 prefill + 1 decode replica. Without a ledger every prompt goes to the prefill replica (the old gateway);
    with one, each prompt's side is the ledger's decision at its arrival (`drain`: the ledger is told the decode
    side's measured step time, so it expects the decode side's budget to stop binding when its decodes end)."""
    store = InProcessStore()
    prefill = Replica(Engine(model, config(**cfg), kv_store=store))
    decode = Replica(Engine(model, config(**cfg), kv_store=store))
    handed: dict[int, Arrival] = {}
    placed: dict[int, Placement] = {}
    releases: list[tuple[float, Placement]] = []  # (time, placement): due once the replay's time reaches it
    ended: list[tuple[float, int]] = []  # (time, max new tokens) of requests the decode replica answered

    def arrive(a: Arrival) -> None:
        if ledger is not None:
            for due in [r for r in releases if r[0] <= a.at]:
                releases.remove(due)
                ledger.done(due[1])
            for due in [e for e in ended if e[0] <= a.at]:
                ended.remove(due)
                ledger.end_decode(due[1])
            if drain:  # what the replicas report
                ledger.decode_step_tokens = decode_step_tokens(prefill.engine, decode.engine)
            placement = placed[id(a)] = ledger.place(len(a.prompt))
            ledger.start_decode(a.max_new)
            a.side = placement.side.value
            if placement.side is Side.LOCAL:
                decode.submit(a, a.at)
                return
        a.side = a.side or "prefill"
        shadow = Arrival(a.at, a.prompt, 1, a.kind)  # the prefill's own record (one token)
        handed[id(shadow)] = a
        prefill.submit(shadow, a.at)

    def stepped(replica: Replica, first: list[Arrival]) -> None:
        if replica is prefill:
            while prefill.done:
                shadow = prefill.done.pop()
                a = handed[id(shadow)]
                a.started, a.prefilled = shadow.started, prefill.clock
                decode.submit(a, prefill.clock)  # decodes from the prefill's end on
                if id(a) in placed:
                    releases.append((prefill.clock, placed[id(a)]))
        else:
            releases.extend((decode.clock, placed[id(a)]) for a in first if placed.get(id(a), None) is not None
                            and placed[id(a)].side is Side.LOCAL)
            ended.extend((decode.clock, a.max_new) for a in decode.done[num_ended[0]:] if id(a) in placed)
            num_ended[0] = len(decode.done)

    num_ended = [0]

    run_until_done([prefill, decode], stepped, arrivals, arrive)
    for _, placement in releases:
        ledger.done(placement)  # type: ignore[union-attr]  # (only a ledger's placements are released)
    for _, max_new in ended:
        ledger.end_decode(max_new)  # type: ignore[union-attr]
    stats = {k: v for k, v in decode.engine.stats().items() if k.startswith("kv_transfer_")}
    stats["slowest"] = slowest_first_token(arrivals, prefill)
    return arrivals, stats


def slowest_first_token(arrivals: list[Arrival], prefill: Replica) -> str:
    """Where the slowest first token's time went (the TTFT p99 of a dozen requests is their max), and how much prompt
    work each side had: the prefill replica's busy share from the first prompt it got to that one's end says
    whether its queue (its capacity) or the decode side set it."""
    a = max(arrivals, key=lambda r: r.times[0] - r.at)
    ttft, wait = a.times[0] - a.at, (a.started if a.started is not None else a.times[0]) - a.at
    if a.prefilled is None:
        where = f"prefilled on the decode replica: waited {wait:.2f} s, then {a.times[0] - a.at - wait:.2f} s"
        end = a.times[0]
    else:
        where = (f"waited {wait:.2f} s for the prefill replica, prefilled in {a.prefilled - a.at - wait:.2f} s, then "
                 f"{a.times[0] - a.prefilled:.2f} s on the decode replica (load, last block, first token)")
        end = a.prefilled
    begin = min(r.at for r in arrivals if r.side != "local")
    busy = sum(dt for t, dt in prefill.steps if begin < t <= end)
    remote = sum(len(r.prompt) for r in arrivals if r.side != "local")
    return (f"slowest TTFT {ttft:.2f} s, a {len(a.prompt)}-token {a.kind} prompt arriving at {a.at:.2f} s, {where}; "
            f"the prefill replica was busy {busy:.2f} s of the {end - begin:.2f} s from its first prompt to "
            f"{'that one' if a.prefilled is not None else 'then'} ({remote} prompt tokens in all, "
            f"{sum(dt for _, dt in prefill.steps):.2f} s busy); {len(arrivals) - sum(r.side != 'local' for r in arrivals)}"
            f" prompts, {sum(len(r.prompt) for r in arrivals) - remote} tokens prefilled on the decode replica")


def decode_step_tokens(prefill: Engine, decode: Engine) -> float | None:
    """A decode-only step of the decode replica in tokens of the prefill replica's prefill, from the two replicas'
    own cost models (their `stats()`, as a gateway reads them); None until the decode replica timed such steps."""
    seconds = decode.stats().get("kv_transfer_cost_decode_step_seconds", 0.0)
    return seconds * prefill.stats()["kv_transfer_cost_prefill_tokens_per_s"] if seconds else None


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def summarize(arrivals: list[Arrival]) -> dict[str, float]:
    ttft = [a.times[0] - a.at for a in arrivals]
    gaps = [b - a for r in arrivals if r.kind == "short" for a, b in zip(r.times, r.times[1:])]
    return {"ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99), "itl_p50": pct(gaps, 0.5),
            "itl_p99": pct(gaps, 0.99), "itl_max": max(gaps),
            "local": sum(a.side == "local" for a in arrivals), "n": len(arrivals)}


def run_seed(model, args, seed: int) -> dict[str, dict]:
    base = workload(args, seed)
    results, tokens = {}, {}
    for name in args.setups:
        arrivals, stats = fresh(base), {}
        if name == "colocated x2":
            colocated(model, arrivals)
        elif name == "colocated x2, chunked":
            colocated(model, arrivals, max_prefill_tokens_per_step=args.chunk)
        elif name == "1 prefill + 1 decode":
            _, stats = disaggregated(model, arrivals)
        else:
            ledger = PlacementLedger(block_size=BLOCK_SIZE, local_budget=args.decode_budget,
                                     step_ratio=args.decode_ratio)
            _, stats = disaggregated(model, arrivals, ledger, args.drain,
                                     max_prefill_tokens_per_step=args.decode_budget,
                                     max_prefill_step_time_ratio=args.decode_ratio)
            assert ledger.queued == {Side.PREFILL: 0, Side.LOCAL: 0} and ledger.drain() in (0, math.inf), ledger.queued
        results[name], tokens[name] = {**summarize(arrivals), **stats}, [a.tokens for a in arrivals]
    reference = tokens[args.setups[0]]
    assert all(t == reference for t in tokens.values()), "greedy tokens differ between setups"
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shorts", type=int, default=8)
    parser.add_argument("--longs", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between short arrivals")
    parser.add_argument("--short-len", type=int, default=64, help="tokens of a short prompt")
    parser.add_argument("--long-len", type=int, default=1024, help="tokens of the shortest long prompt (up to 2x)")
    parser.add_argument("--chunk", type=int, default=256, help="max_prefill_tokens_per_step of the chunked setup")
    parser.add_argument("--decode-budget", type=int, default=32,
                        help="max_prefill_tokens_per_step of the placed PD setup (the decode side's budget)")
    parser.add_argument("--decode-ratio", type=float, default=None,
                        help="max_prefill_step_time_ratio of the placed PD setup (its steps sized by time)")
    parser.add_argument("--drain", action="store_true",
                        help="tell the placed PD setup's ledger the decode side's measured step time (its drain)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS),
                        help="a subset for a quick look (the targets need 'colocated x2' and a PD setup)")
    parser.add_argument("--label", default="", help="a name for this load in the output")
    parser.add_argument("--out", type=Path, default=None, help="append this load's section to FILE")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    model = build_model()
    warm = Engine(model, config())
    warm.run([warm.add_request(workload(args, 0)[0].prompt, SamplingParams(max_new_tokens=2))])  # kernels loaded

    per_seed = {seed: run_seed(model, args, seed) for seed in args.seeds}
    rows = []
    for name in args.setups:
        for seed, results in per_seed.items():
            r = results[name]
            rows.append([name, seed, *(f"{r[k] * 1000:.0f}" for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99",
                                                                       "itl_max")),
                         f"{r['itl_p99'] / r['itl_p50']:.2f}", f"{r['local']}/{r['n']}" if "PD" in name else ""])
    title = (f"{args.label + ': ' if args.label else ''}{args.shorts} short requests ({args.short_len}-token prompts, "
             f"48 new tokens, one every {args.gap} s) and {args.longs} long prompts ({args.long_len}-"
             f"{2 * args.long_len} tokens, 8 new) arriving among them; 2 replicas, ~60M random Llama, fp32, block "
             f"size {BLOCK_SIZE}; milliseconds on each replica's own CPU clock; seeds {args.seeds}:")
    table = print_table(["setup", "seed", "TTFT p50", "TTFT p99", "inter-token p50 (short)", "inter-token p99 (short)",
                         "inter-token max", "p99 / p50", "prefilled locally"], rows, title=title)
    lines = []
    for name in [n for n in ("1 prefill + 1 decode", "PD, placed") if n in args.setups and SETUPS[0] in args.setups]:
        ttft = [per_seed[s][name]["ttft_p99"] / per_seed[s]["colocated x2"]["ttft_p99"] for s in args.seeds]
        itl = [per_seed[s][name]["itl_p99"] / per_seed[s][name]["itl_p50"] for s in args.seeds]
        held = max(ttft) <= 1.5 and max(itl) <= 1.5
        lines.append(f"- {name}: TTFT p99 / colocated's = {', '.join(f'{x:.2f}' for x in ttft)} (median "
                     f"{median(ttft):.2f}); inter-token p99 / p50 = {', '.join(f'{x:.2f}' for x in itl)} (median "
                     f"{median(itl):.2f}): both targets (<= 1.5x) {'held on every seed' if held else 'NOT held'}.")
    slowest = [f"- {name}, seed {seed}: {results[name]['slowest']}" for name in args.setups
               for seed, results in per_seed.items() if "slowest" in results[name]]
    verdict = ("Targets (issue 39), per seed:\n" + "\n".join(lines) + "\nEvery request's greedy tokens are the same "
               "in the four setups (asserted).\n\nThe slowest first token of each PD run:\n" + "\n".join(slowest))
    command = (f"python benchmarks/disagg.py --shorts {args.shorts} --longs {args.longs} --gap {args.gap} "
               f"--short-len {args.short_len} --long-len {args.long_len} --chunk {args.chunk} --decode-budget "
               f"{args.decode_budget}" + (f" --decode-ratio {args.decode_ratio}" if args.decode_ratio else "")
               + (" --drain" if args.drain else "") + f" --seeds {' '.join(map(str, args.seeds))}"
               + ("" if list(args.setups) == list(SETUPS) else " --setups " + " ".join(f"'{x}'" for x in args.setups))
               + (f" --label '{args.label}'" if args.label else "") + (f" --out {args.out}" if args.out else ""))
    note = (f"`{command}`; load average (1 min) {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
            "(per-process CPU clocks make the replay independent of it, up to cache effects).")
    print(verdict)
    print(note)
    if args.out:
        if not args.out.exists():
            args.out.write_text("# Prefill/decode disaggregation vs colocated replicas\n\nOn "
                                f"{machine()}; one section per load (`--out` appends).\n")
        with args.out.open("a") as f:
            f.write(f"\n## {args.label or 'load'}\n\n{note}\n\n{table}\n\n{verdict}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
