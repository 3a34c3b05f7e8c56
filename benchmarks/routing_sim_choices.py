"""Per-request analysis of the routing simulator (issue 37, `benchmarks/routing/choices.py`).

    python benchmarks/routing_sim_choices.py attribute --workload mix+preamble --replicas 8 --seeds 0 1
    python benchmarks/routing_sim_choices.py bound --trace synthetic_trace.jsonl --replicas 100 --seeds 0 1 2

`attribute`: ours and Ray's PrefixCacheAffinityRouter on the same workload and seed; ours' hit tokens minus Ray's,
request by request, by the rule behind ours' choice. `bound`: ours on a trace; what other assignments of the same
per-request work would give as max/mean work (offline LPT, offline keeping ours' hits, online greedy in arrival
order) and, for each large request, how much work the lightest replica held when it arrived.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import routing_sim as sim
from benchmarks.routing.choices import attribute, run_recorded, work_bounds
from benchmarks.routing.policies import Ours, RayPrefixAffinity


def _attribute(args: argparse.Namespace) -> None:
    for n in args.replicas:
        for seed in args.seeds:
            ours, mine = run_recorded(sim.simulate, Ours, n, seed, args.load, workload=args.workload)
            ray, theirs = run_recorded(sim.simulate, RayPrefixAffinity, n, seed, args.load, workload=args.workload)
            rows = attribute(mine, theirs, sim.WARMUP)
            print(f"\n{args.workload}, {n} replicas, seed {seed}: hit ours {ours.hit_rate:.2%}, Ray {ray.hit_rate:.2%} "
                  f"({100 * (ours.hit_rate - ray.hit_rate):+.3f} points); mean TTFT ours {ours.mean_ttft_s:.3f} s, "
                  f"Ray {ray.mean_ttft_s:.3f} s\n")
            print("| ours' choice | prompts | requests | hit tokens, ours - Ray | points | mean TTFT s, ours / Ray |")
            print("|---|---|---|---|---|---|")
            for r in rows:
                print(f"| {r.rule} | {r.prompts} | {r.num_requests} | {r.hit_tokens_diff:+,} | {r.points:+.3f} | "
                      f"{r.mean_ttft_ours_s:.3f} / {r.mean_ttft_theirs_s:.3f} |")


def _bound(args: argparse.Namespace) -> None:
    workload = f"trace:{args.trace}"
    print("| replicas | seed | ours' hit | ours: max/mean | largest request / mean replica | offline LPT | groups "
          "(largest / mean) | offline LPT, ours' hits kept | online greedy, arrival order |")
    print("|---|---|---|---|---|---|---|---|---|")
    larges = []
    for n in args.replicas:
        for seed in args.seeds:
            result, mine = run_recorded(sim.simulate, Ours, n, seed, args.load, workload=workload,
                                        trace_block_size=args.trace_block_size)
            b = work_bounds(mine, n, args.trace_block_size, args.target)
            print(f"| {n} | {seed} | {result.hit_rate:.2%} | {b.ours:.3f} | {b.largest_request:.3f} | "
                  f"{b.offline_lpt:.4f} | {b.num_groups} ({b.largest_group:.3f}) | {b.offline_groups_lpt:.4f} | "
                  f"{b.online_greedy:.3f} |")
            larges.append((n, seed, b))
    for n, seed, b in larges:
        print(f"\nrequests of >= 0.3 mean replica works, {n} replicas, seed {seed} (in mean replica works of "
              f"{b.mean_work:,.0f} tokens):\n")
        print(f"| arrival | work | lightest replica then, ours | mean then | lightest, greedy | room for "
              f"max/mean <= {args.target} |")
        print("|---|---|---|---|---|---|")
        for r in b.large:
            print(f"| {r.arrival_share:.0%} | {r.work:.2f} | {r.lightest_ours:.2f} | {r.mean_then:.2f} | "
                  f"{r.lightest_greedy:.2f} | {r.room:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("attribute", help="ours vs Ray's router, request by request")
    a.add_argument("--workload", default="mix", choices=sim.WORKLOADS)
    b = sub.add_parser("bound", help="max/mean work of other assignments of ours' per-request work")
    b.add_argument("--trace", type=Path, required=True, help="a Mooncake-format JSONL trace")
    b.add_argument("--trace-block-size", type=int, default=512)
    b.add_argument("--target", type=float, default=1.25, help="the max/mean work target")
    for p in (a, b):
        p.add_argument("--replicas", type=int, nargs="+", default=[8])
        p.add_argument("--seeds", type=int, nargs="+", default=[0])
        p.add_argument("--load", type=float, default=0.8)
    args = parser.parse_args(argv)
    (_attribute if args.command == "attribute" else _bound)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
