"""Routing simulator (issues 20 and 37): N continuous-batching replicas with LRU prefix caches behind routing policies.

    python benchmarks/routing_sim.py                                 # every workload, 8/32/100 replicas, 3 seeds
    python benchmarks/routing_sim.py --replicas 8 --workloads long --seeds 1
    python benchmarks/routing_sim.py --trace conversation_trace.jsonl --trace-block-size 512   # replay a trace

Discrete events, one process per run, no torch. The parts (`benchmarks/routing/`):
- workloads.py: synthetic sessions (short, long 8k-30k-token, mixed prompts; with `+ preamble`, every prompt starts
  with the same 128 tokens, as a chat template's text does), or a Mooncake-format trace (`--trace`). Synthetic
  sessions are a closed loop: a follow-up turn arrives a think time (~3 s) after the previous one ended.
- replica.py: a token budget per step (8,192) shared by the decode batch and prefill chunks, 10 ms + 0.06 ms a
  token per step, up to 128 running requests, an LRU prefix cache of `--cache-tokens` (1M tokens) per replica.
- policies.py: round robin, power of two, consistent hash (1st block), bounded consistent hash (c = 1.25, first 4
  blocks), Ray's PrefixCacheAffinityRouter, ours (`CacheAwareRouter`, summaries every 1 s), and an oracle reading
  the true caches within the bounded hash's load bound.
- load: arrivals are set so a cluster without prefix caching would be at `--load` utilization (prefill at the
  full budget's speed, decode at 32 sequences a step); a trace's timestamps are scaled to the same offered load.
  Routers and load reports see each request's max_tokens (512, or its output length when longer), never the true
  output length.
Metrics count requests arriving after a warm-up (the first 10% of the arrival window). Hit rate: prompt tokens
served from the prefix cache / prompt tokens. TTFT: arrival to the end of the step that finished the prefill
(percentiles only over >= 1,000 requests). Work: tokens each replica computed; max/mean over replicas.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import json
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.routing import replica as replica_model
from benchmarks.routing.policies import BASELINES, Oracle, Ours
from benchmarks.routing.replica import Replica, SimRequest
from benchmarks.routing.workloads import KINDS, Workload, read_trace, spread, synthetic
from hf_paged.scaleout import RouterConfig

BLOCK_SIZE = 64  # synthetic workloads' tokens per block
CACHE_TOKENS = 1 << 20
REPORT_PERIOD = 1.0
SUMMARY_CAP = 1 << 30  # the whole cache, as ReplicaReporter reports by default
REQUESTS_PER_REPLICA = 250
MIN_REQUESTS = 2000
WARMUP = 0.1
MIN_FOR_P99 = 1000
POLICIES = [*BASELINES, Ours, Oracle]
WORKLOADS = [f"{k}{p}" for k in KINDS for p in ("", "+preamble")]


@dataclass(slots=True)
class Result:
    workload: str
    policy: str
    num_replicas: int
    seed: int
    num_requests: int
    hit_rate: float
    ideal_hit_rate: float
    p50_ttft_s: float | None  # None below MIN_FOR_P99 requests
    p99_ttft_s: float | None
    mean_ttft_s: float
    max_over_mean: float  # tokens computed: busiest replica / mean
    utilization: float
    route_us: float
    sim_s: float
    report_bytes_s: float = 0.0  # ours: report bytes (summaries + events) a second per replica
    reports_s: float = 0.0  # ours: report messages (summaries + non-empty event batches) a second per replica
    event_share: float = 0.0  # ours: the share of those bytes that are events
    max_work_tokens: int = 0  # tokens the busiest replica computed (0 in results written before this field)


def build_workload(name: str, num_replicas: int, seed: int, load: float, trace_block_size: int) -> Workload:
    rng = random.Random(seed)
    if name.startswith("trace:"):
        workload = read_trace(Path(name[6:]), block_size=trace_block_size)
        span = workload.sessions[-1].start - workload.sessions[0].start
        scale = _window(workload, num_replicas, load) / max(span, 1e-9)
        for s in workload.sessions:
            s.start *= scale
        return workload
    kind, _, preamble = name.partition("+")
    workload = synthetic(kind, num_requests=max(MIN_REQUESTS, REQUESTS_PER_REPLICA * num_replicas),
                         preamble=bool(preamble), block_size=BLOCK_SIZE, seed=seed)
    spread(workload, _window(workload, num_replicas, load), rng)
    return workload


def _window(workload: Workload, num_replicas: int, load: float) -> float:
    """Seconds over which the workload's tokens keep `num_replicas` at `load` without any prefix cache."""
    prompt = output = 0
    for s in workload.sessions:
        if s.fixed:
            prompt, output = prompt + sum(p for _, p, _ in s.fixed), output + sum(o for _, _, o in s.fixed)
        else:
            history = s.base.num_tokens
            for user, out in s.turns:
                prompt, output, history = prompt + history + user, output + out, history + user + out
    budget = replica_model.MAX_BATCH_TOKENS
    prefill_s = replica_model.STEP_TOKEN_S + replica_model.STEP_S / budget
    decode_s = replica_model.STEP_TOKEN_S + replica_model.STEP_S / 32
    return (prompt * prefill_s + output * decode_s) / (load * num_replicas)


def simulate(policy_cls, num_replicas: int, seed: int, load: float = 0.8, *, workload: str = "short",
             config: RouterConfig | None = None, report_period: float = REPORT_PERIOD,
             cache_tokens: int = CACHE_TOKENS, trace_block_size: int = 512, label: str | None = None,
             event_period: float = float("inf")) -> Result:
    """One run: the same workload and seed give the same sessions to every policy. With a finite `event_period`,
    ours also gets each replica's block events every `event_period` seconds between its summaries (the events
    recorded before a summary are in it and are not sent)."""
    wall = time.perf_counter()
    wl = build_workload(workload, num_replicas, seed, load, trace_block_size)
    bs = wl.block_size
    rng = random.Random(seed + 1)
    policy = (policy_cls(num_replicas, rng, bs) if config is None else policy_cls(num_replicas, rng, bs, config))
    replicas = [Replica(max(1, cache_tokens // bs), bs) for _ in range(num_replicas)]
    events: list = []
    order = itertools.count()
    for i, s in enumerate(wl.sessions):
        heapq.heappush(events, (s.start, next(order), 0, i, 0))  # kinds: 0 arrive, 1 step end, 2 report
    reports = hasattr(policy, "report") and report_period != float("inf")
    for r in range(num_replicas if reports else 0):  # staggered: replicas do not report in step
        heapq.heappush(events, (report_period * (r + 1) / num_replicas, next(order), 2, r, 0))
    streaming = reports and event_period != float("inf")
    for r in range(num_replicas if streaming else 0):  # kind 3: a replica's block events reach the router
        replicas[r].take_events()  # starts recording
        heapq.heappush(events, (event_period * (r + 0.5) / num_replicas, next(order), 3, r, 0))
    streams, finished, rids = {}, [], itertools.count()
    segments = itertools.count(1)
    warm = wl.sessions[0].start + WARMUP * (wl.sessions[-1].start - wl.sessions[0].start)
    live = len(wl.sessions)

    def push_step(index: int, step) -> None:
        if step is not None:
            heapq.heappush(events, (step.end, next(order), 1, index, replicas[index].version))

    while events:
        now, _, kind, a, b = heapq.heappop(events)
        if kind == 2:
            if live:
                policy.report(a, replicas[a].summary(SUMMARY_CAP), replicas[a].load_tokens(now))
                if streaming:
                    replicas[a].take_events()  # in the summary already
                heapq.heappush(events, (now + report_period, next(order), 2, a, 0))
        elif kind == 3:
            if live:
                batch = replicas[a].take_events()
                if batch.kinds:
                    policy.events(a, batch.kinds, batch.keys)
                heapq.heappush(events, (now + event_period, next(order), 3, a, 0))
        elif kind == 0:
            session = wl.sessions[a]
            if session.fixed:
                keys, prompt, out = session.fixed[b]
                request = SimRequest(next(rids), a, b, now, keys, prompt, out, out_keys=keys)
            else:
                base = streams.pop(a) if b else session.base
                user, out = session.turns[b]
                stream = base.extend(next(segments), user)
                full = stream.extend(next(segments), out)
                streams[a] = full
                request = SimRequest(next(rids), a, b, now, stream.keys, stream.num_tokens, out, out_keys=full.keys)
            request.replica = policy.choose(request, replicas)
            if hasattr(policy, "routed"):
                policy.routed(request)
            target = replicas[request.replica]
            target.waiting.append(request)
            if target.step is None:
                push_step(request.replica, target.plan(now))
            else:
                push_step(request.replica, target.cut(now))
        else:
            target = replicas[a]
            if b != target.version:
                continue  # replaced by a cut step
            _, ended = target.finish_step()
            for request in ended:
                finished.append(request)
                if hasattr(policy, "finished"):
                    policy.finished(request)
                session = wl.sessions[request.session]
                if request.turn + 1 < session.num_turns:
                    heapq.heappush(events, (now + session.think[request.turn], next(order), 0, request.session,
                                            request.turn + 1))
                else:
                    live -= 1
                    streams.pop(request.session, None)
            push_step(a, target.plan(now))

    measured = [r for r in finished if r.arrival >= warm]
    prompt_tokens = sum(r.num_prompt_tokens for r in measured)
    ttfts = sorted(r.first_token - r.arrival for r in measured)
    work = [r.work_tokens for r in replicas]
    span = max(r.first_token for r in finished) - wl.sessions[0].start
    enough = len(ttfts) >= MIN_FOR_P99
    wire = getattr(policy, "report_bytes", 0) + getattr(policy, "event_bytes", 0)
    per_s = max(1e-9, span * num_replicas)
    return Result(
        workload=wl.name, policy=label or policy.name, num_replicas=num_replicas, seed=seed,
        num_requests=len(measured), hit_rate=sum(r.hit_tokens for r in measured) / prompt_tokens,
        ideal_hit_rate=_ideal_hits(finished, warm, bs) / prompt_tokens,
        p50_ttft_s=ttfts[len(ttfts) // 2] if enough else None,
        p99_ttft_s=ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if enough else None,
        mean_ttft_s=sum(ttfts) / len(ttfts), max_over_mean=max(work) / (sum(work) / len(work)), max_work_tokens=max(work),
        utilization=sum(r.busy_s for r in replicas) / (span * num_replicas),
        route_us=policy.route_s / len(finished) * 1e6 if isinstance(policy, Ours) else 0.0,
        sim_s=time.perf_counter() - wall,
        report_bytes_s=wire / per_s,
        reports_s=(getattr(policy, "num_reports", 0) + getattr(policy, "num_event_batches", 0)) / per_s,
        event_share=getattr(policy, "event_bytes", 0) / wire if wire else 0.0,
    )


def _ideal_hits(finished: list[SimRequest], warm: float, block_size: int) -> int:
    """Hit tokens (of requests arriving after `warm`) of one infinite cache holding every earlier prompt and
    output, in arrival order: the ceiling any routing policy could reach on this workload."""
    seen: set[int] = set()
    hits = 0
    for request in sorted(finished, key=lambda r: r.arrival):
        keys, n = request.keys, 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        if request.arrival >= warm:
            hits += min(n * block_size, request.num_prompt_tokens - 1)
        seen.update(request.out_keys)
    return hits


def _run(args: tuple) -> Result:
    cls_name, n, seed, load, workload, cache_tokens, trace_block_size = args
    cls = next(c for c in POLICIES if c.__name__ == cls_name)
    return simulate(cls, n, seed, load, workload=workload, cache_tokens=cache_tokens, trace_block_size=trace_block_size)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.routing.report import machine, paired, report, summary, verdicts

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 32, 100])
    parser.add_argument("--seeds", type=int, default=3, help="N seeds from --first-seed; tables give the mean and "
                        "min-max")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (to add seeds to an earlier run)")
    parser.add_argument("--workloads", nargs="*", default=WORKLOADS, help=f"any of {WORKLOADS} (none: --trace only)")
    parser.add_argument("--trace", type=Path, nargs="*", default=[], help="Mooncake-format JSONL traces to replay")
    parser.add_argument("--trace-block-size", type=int, default=512, help="tokens per hash_ids block of --trace")
    parser.add_argument("--policies", nargs="+", default=[c.__name__ for c in POLICIES])
    parser.add_argument("--load", type=float, default=0.8,
                        help="utilization a cluster without prefix caching would see (sets the arrival rate)")
    parser.add_argument("--cache-tokens", type=int, default=CACHE_TOKENS, help="prefix cache per replica, tokens")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's result (JSON lines) here, "
                        "each as it ends")
    parser.add_argument("--from-json", type=Path, nargs="+", default=None,
                        help="run nothing: report the results in these JSON lines files (of earlier --json runs)")
    args = parser.parse_args(argv)
    for w in args.workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}: choose from {WORKLOADS}")
    workloads = [*args.workloads, *(f"trace:{p}" for p in args.trace)]
    wall = time.perf_counter()
    jobs = [(cls, n, seed, args.load, w, args.cache_tokens, args.trace_block_size)
            for w in workloads for n in args.replicas for cls in args.policies
            for seed in range(args.first_seed, args.first_seed + args.seeds)]
    sink = open(args.json, "a") if args.json is not None else None  # noqa: SIM115 (closed below)

    def done(index: int, r: Result) -> None:
        results[index] = r
        print(f"  {r.workload}, {r.num_replicas}, {r.policy}, seed {r.seed}: {r.sim_s:.1f} s", file=sys.stderr,
              flush=True)
        if sink is not None:
            sink.write(json.dumps(dataclasses.asdict(r)) + "\n")
            sink.flush()

    results: list = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: (-jobs[i][1], jobs[i][0] != "Ours"))  # the longest runs first
    if args.from_json:
        merged = [Result(**json.loads(line)) for path in args.from_json for line in path.read_text().splitlines()
                  if line.strip()]  # a run found twice (same workload, size, policy, seed): the later file's
        results = list({(r.workload, r.num_replicas, r.policy, r.seed): r for r in merged}.values())
        kinds = [w.replace("+", " + ") for w in WORKLOADS]
        names = [c.name for c in POLICIES]
        results.sort(key=lambda r: (kinds.index(r.workload) if r.workload in kinds else len(kinds), r.workload,
                                    r.num_replicas, names.index(r.policy) if r.policy in names else 0, r.seed))
    elif args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(_run, jobs[i]): i for i in order}
            for future in as_completed(futures):
                done(futures[future], future.result())
    else:
        for i in order:
            done(i, _run(jobs[i]))
    if sink is not None:
        sink.close()
    lines, held, checked = verdicts(results)
    ours = [r.route_us for r in results if r.route_us]
    text = "\n".join([
        f"machine: {machine()}",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "command: python benchmarks/routing_sim.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        (f"model: {BLOCK_SIZE}-token blocks (traces: {args.trace_block_size}), {args.cache_tokens} tokens of LRU "
         f"prefix cache per replica, steps of <= {replica_model.MAX_BATCH_TOKENS} tokens costing "
         f"{replica_model.STEP_S * 1e3:g} ms + {replica_model.STEP_TOKEN_S * 1e3:g} ms a token, <= "
         f"{replica_model.MAX_NUM_SEQS} running, load {args.load}, summaries every {REPORT_PERIOD:g} s, seeds "
         f"0-{args.seeds - 1}, first {WARMUP:.0%} of the arrivals not measured"),
        "",
        *summary(results),
        "",
        *report(results),
        f"Targets held: {held} of {checked}.",
        "",
        *lines,
        "",
        *(["Ours against Ray's PrefixCacheAffinityRouter, seed by seed (mean, min..max over seeds):", "", *pairs]
          if (pairs := paired(results)) else []),
        "",
        f"ours: {statistics.fmean(ours):.0f} us a routing decision on average (wall time)" if ours else "",
        f"simulated in {time.perf_counter() - wall:.1f} s",
    ])
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
