"""Block events beside summaries (issue 37, point 3): does a router fed each replica's stored/removed blocks as they
happen route better than one fed a full summary every period, and what does each cost on the wire?

    python benchmarks/routing_events.py                        # every workload, 8/32 replicas, 3 seeds, 4 modes
    python benchmarks/routing_events.py --workloads mix --replicas 8 --seeds 1 --cache-tokens 131072

Ours (`CacheAwareRouter`) in `routing_sim.simulate`, the router's view of each replica updated by:
- summaries every 1 s (the behaviour before: `RoutingStats(events=False)` polled each second);
- summaries every 1 s + events every 0.1 s (each replica's events since its last report reach the router in one
  batch a tenth of a second, staggered: a modelled delay of up to 0.1 s, about one Ray Serve controller tick);
- summaries every 10 s + events every 0.1 s (the summary as a rare resynchronisation);
- summaries every 10 s alone (what the events' cost saving is measured against).
Load reaches the router with the summaries only. Bytes: a summary 8 a block + 48, an event batch 9 an event + 16
(`CacheSummary.nbytes`, `CacheEvents.nbytes`); messages: summaries + non-empty event batches. Both per replica per
second of simulated time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import routing_sim as sim
from benchmarks.routing.report import machine

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    report_period: float  # seconds between a replica's summaries
    event_period: float  # seconds between a replica's event batches (inf: none)


MODES = [Mode("summaries 1 s", 1.0, INF), Mode("summaries 1 s + events 0.1 s", 1.0, 0.1),
         Mode("summaries 10 s + events 0.1 s", 10.0, 0.1), Mode("summaries 10 s", 10.0, INF)]


def _run(job: tuple) -> dict:
    mode_name, workload, n, seed, cache_tokens = job
    mode = next(m for m in MODES if m.name == mode_name)
    result = sim.simulate(sim.Ours, n, seed, workload=workload, report_period=mode.report_period,
                          event_period=mode.event_period, cache_tokens=cache_tokens, label=mode.name)
    return {**dataclasses.asdict(result), "cache_tokens": cache_tokens}


def _cell(values: list, fmt: str, scale: float = 1.0) -> str:
    if not values or any(v is None for v in values):
        return "-"
    values = [v * scale for v in values]
    mean = fmt.format(statistics.fmean(values))
    return mean if len(values) == 1 else f"{mean} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def table(rows: list[dict]) -> list[str]:
    groups: dict = defaultdict(list)
    for r in rows:
        groups[(r["workload"], r["cache_tokens"], r["num_replicas"], r["policy"])].append(r)
    names = [m.name for m in MODES]
    head = ("| workload | cache tokens | replicas | router's view | requests | prefix hit rate | p99 TTFT s | "
            "max/mean work | report bytes/s a replica | messages/s a replica | events' share of bytes |")
    lines = [head, "|" + "---|" * 11]
    for (workload, cache, n, mode), runs in sorted(groups.items(), key=lambda kv: (
            sim.WORKLOADS.index(kv[0][0].replace(" + ", "+")) if kv[0][0].replace(" + ", "+") in sim.WORKLOADS
            else 99, kv[0][1], kv[0][2], names.index(kv[0][3]))):
        lines.append(
            f"| {workload} | {cache} | {n} | {mode} | {runs[0]['num_requests']} | "
            f"{_cell([r['hit_rate'] for r in runs], '{:.1f}%', 100)} | {_cell([r['p99_ttft_s'] for r in runs], '{:.2f}')} | "
            f"{_cell([r['max_over_mean'] for r in runs], '{:.3f}')} | "
            f"{_cell([r['report_bytes_s'] for r in runs], '{:,.0f}')} | {_cell([r['reports_s'] for r in runs], '{:.2f}')} | "
            f"{_cell([r['event_share'] for r in runs], '{:.0f}%', 100)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=sim.WORKLOADS)
    parser.add_argument("--modes", nargs="+", default=[m.name for m in MODES])
    parser.add_argument("--cache-tokens", type=int, nargs="+", default=[sim.CACHE_TOKENS])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also append every run (JSON lines) here")
    parser.add_argument("--from-json", type=Path, nargs="+", default=None, help="run nothing: report these runs")
    args = parser.parse_args(argv)
    wall = time.perf_counter()
    if args.from_json:
        rows = [json.loads(line) for p in args.from_json for line in p.read_text().splitlines() if line.strip()]
    else:
        jobs = [(m, w, n, s, c) for w in args.workloads for c in args.cache_tokens for n in args.replicas
                for m in args.modes for s in range(args.seeds)]
        jobs.sort(key=lambda j: -j[2])  # the longest runs first
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = []
            for row in pool.map(_run, jobs):
                rows.append(row)
                print(f"  {row['workload']}, {row['num_replicas']}, {row['policy']}, seed {row['seed']}: "
                      f"{row['sim_s']:.1f} s", file=sys.stderr, flush=True)
                if args.json is not None:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(row) + "\n")
    print("\n".join([f"machine: {machine()}", f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
                     "command: python benchmarks/routing_events.py " + " ".join(argv if argv is not None
                                                                                   else sys.argv[1:]),
                     "", *table(rows), "", f"ran in {time.perf_counter() - wall:.1f} s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
