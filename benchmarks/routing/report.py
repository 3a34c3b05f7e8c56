"""The simulator's report: one table per workload (mean over seeds, min-max beside it) and the targets' verdicts."""

from __future__ import annotations

import os
import platform
import statistics
from collections import defaultdict

__all__ = ["machine", "paired", "report", "summary", "verdicts"]

OURS = "ours (CacheAwareRouter)"
ORACLE = "oracle (true caches, same bound)"
RAY = "Ray PrefixCacheAffinity"
BALANCE = 1.25  # the max/mean work target; a baseline past it buys its hit rate with a hot replica


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, python {platform.python_version()}"


def _stat(values: list, scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    if any(v is None for v in values):
        return "-"
    values = [v * scale for v in values]
    mean = statistics.fmean(values)
    if len(values) == 1:
        return fmt.format(mean)
    return f"{fmt.format(mean)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _mean(values: list) -> float | None:
    return None if any(v is None for v in values) else statistics.fmean(values)


def _groups(results: list) -> dict:
    groups: dict = defaultdict(list)
    for r in results:
        groups[(r.workload, r.num_replicas, r.policy)].append(r)
    return groups


def report(results: list) -> list[str]:
    groups = _groups(results)
    lines = []
    for workload in dict.fromkeys(r.workload for r in results):
        head = "| replicas | policy | requests | prefix hit rate | p50 TTFT s | p99 TTFT s | max/mean work | busy |"
        lines += [f"### {workload}", "", head, "|" + "---|" * 8]
        for (w, n, policy), runs in groups.items():
            if w != workload:
                continue
            lines.append(
                f"| {n} | {policy} | {runs[0].num_requests} | {_stat([r.hit_rate for r in runs], 100, '{:.1f}%')} | "
                f"{_stat([r.p50_ttft_s for r in runs], fmt='{:.2f}')} | {_stat([r.p99_ttft_s for r in runs], fmt='{:.2f}')} | "
                f"{_stat([r.max_over_mean for r in runs])} | {_stat([r.utilization for r in runs], fmt='{:.2f}')} |")
        ideal = [r.ideal_hit_rate for r in results if r.workload == workload and r.policy == OURS]
        if ideal:
            lines.append(f"\nOne infinite cache (the ceiling): {statistics.fmean(ideal):.1%} of prompt tokens.")
        lines.append("")
    return lines


def verdicts(results: list) -> tuple[list[str], int, int]:
    """The targets, per workload and cluster size, on the means over seeds: ours >= the best baseline's hit rate
    (checked twice: among the baselines that keep max/mean work <= 1.25, and among all) and >= 0.9x the oracle's;
    p99 TTFT <= the lowest baseline p99; max/mean work <= 1.25. Returns (lines, held, checked)."""
    groups = _groups(results)
    lines, held, checked = [], 0, 0
    for workload, n in dict.fromkeys((r.workload, r.num_replicas) for r in results):
        runs = {p: rs for (w, m, p), rs in groups.items() if w == workload and m == n}
        if OURS not in runs:
            continue
        ours = runs[OURS]
        baselines = {p: rs for p, rs in runs.items() if p not in (OURS, ORACLE)}
        checks = []
        hit = _mean([r.hit_rate for r in ours])
        balanced = {p: rs for p, rs in baselines.items() if _mean([r.max_over_mean for r in rs]) <= BALANCE}
        for label, pool in (("best balanced baseline's", balanced), ("best baseline's (any balance)", baselines)):
            if pool:
                name, best = max(((p, _mean([r.hit_rate for r in rs])) for p, rs in pool.items()), key=lambda t: t[1])
                checks.append((f"hit {hit:.1%} >= {label} {best:.1%} ({name})", hit >= best - 1e-9,
                               _overlap(ours, pool[name], "hit_rate")))
        p99s = {p: _mean([r.p99_ttft_s for r in rs]) for p, rs in baselines.items()}
        p99s = {p: v for p, v in p99s.items() if v is not None}
        ours_p99 = _mean([r.p99_ttft_s for r in ours])
        if p99s and ours_p99 is not None:
            name, low = min(p99s.items(), key=lambda t: t[1])
            checks.append((f"p99 TTFT {ours_p99:.2f} s <= best baseline's {low:.2f} s ({name})", ours_p99 <= low + 1e-9,
                           _overlap(ours, baselines[name], "p99_ttft_s")))
        if ORACLE in runs:
            oracle = _mean([r.hit_rate for r in runs[ORACLE]])
            checks.append((f"hit >= 0.9 x oracle's {oracle:.1%}", hit >= 0.9 * oracle - 1e-9, False))
        spread = _mean([r.max_over_mean for r in ours])
        checks.append((f"max/mean work {spread:.3f} <= {BALANCE}", spread <= BALANCE, False))
        held += sum(ok for _, ok, _ in checks)
        checked += len(checks)
        marks = [f"{t}: {'yes' if ok else 'NO, inside the seeds spread' if close else 'NO'}" for t, ok, close in checks]
        lines.append(f"- {workload}, {n} replicas: " + "; ".join(marks))
    return lines, held, checked


def _overlap(ours: list, theirs: list, field: str) -> bool:
    """Whether the min-max ranges over seeds of `field` overlap (a difference the seeds do not settle)."""
    a, b = [getattr(r, field) for r in ours], [getattr(r, field) for r in theirs]
    return len(a) > 1 and max(a) >= min(b) and max(b) >= min(a)


def summary(results: list) -> list[str]:
    """One row per workload and cluster size: ours against the best baselines and the oracle (means over seeds)."""
    groups = _groups(results)
    head = ("| workload | replicas | ours: hit | best balanced baseline | best baseline, any balance | oracle | "
            "ours: p99 TTFT s | lowest baseline p99 s | ours: max/mean work |")
    lines = [head, "|" + "---|" * 9]
    for workload, n in dict.fromkeys((r.workload, r.num_replicas) for r in results):
        runs = {p: rs for (w, m, p), rs in groups.items() if w == workload and m == n}
        if OURS not in runs:
            continue
        base = {p: rs for p, rs in runs.items() if p not in (OURS, ORACLE)}
        hits = {p: _mean([r.hit_rate for r in rs]) for p, rs in base.items()}
        balanced = {p: h for p, h in hits.items() if _mean([r.max_over_mean for r in base[p]]) <= BALANCE}
        p99s = {p: v for p, rs in base.items() if (v := _mean([r.p99_ttft_s for r in rs])) is not None}

        def best(table: dict) -> str:
            return "-" if not table else "{1:.1%} ({0})".format(*max(table.items(), key=lambda t: t[1]))

        ours_p99 = _mean([r.p99_ttft_s for r in runs[OURS]])
        oracle = _mean([r.hit_rate for r in runs[ORACLE]]) if ORACLE in runs else None
        lines.append(
            f"| {workload} | {n} | {_mean([r.hit_rate for r in runs[OURS]]):.1%} | {best(balanced)} | {best(hits)} | "
            f"{'-' if oracle is None else f'{oracle:.1%}'} | {'-' if ours_p99 is None else f'{ours_p99:.2f}'} | "
            f"{'-' if not p99s else '{1:.2f} ({0})'.format(*min(p99s.items(), key=lambda t: t[1]))} | "
            f"{_mean([r.max_over_mean for r in runs[OURS]]):.3f} |")
    return lines


def paired(results: list, other: str = RAY) -> list[str]:
    """Ours minus `other` seed by seed (the same seed gives both the same sessions and arrivals), per workload and
    cluster size where both ran on >= 2 common seeds: the mean difference and its min..max over seeds. A difference
    whose min..max straddles 0 is a tie: the seeds do not settle its sign."""
    runs = {(r.workload, r.num_replicas, r.policy, r.seed): r for r in results}
    head = ("| workload | replicas | seeds | ours: hit | theirs: hit | ours - theirs, hit points | "
            "ours - theirs, p99 TTFT ms | ours - theirs, mean TTFT ms | hit rate |")
    lines = [head, "|" + "---|" * 9]
    for workload, n in dict.fromkeys((r.workload, r.num_replicas) for r in results):
        seeds = sorted(s for (w, m, p, s) in runs if (w, m, p) == (workload, n, OURS) and (w, m, other, s) in runs)
        if len(seeds) < 2:
            continue
        ours = [runs[(workload, n, OURS, s)] for s in seeds]
        theirs = [runs[(workload, n, other, s)] for s in seeds]
        hit = [100 * (a.hit_rate - b.hit_rate) for a, b in zip(ours, theirs)]
        p99 = [1e3 * (a.p99_ttft_s - b.p99_ttft_s) for a, b in zip(ours, theirs)
               if a.p99_ttft_s is not None and b.p99_ttft_s is not None]
        mean = [1e3 * (a.mean_ttft_s - b.mean_ttft_s) for a, b in zip(ours, theirs)]
        sign = ("tie (straddles 0)" if min(hit) < 0 < max(hit) else "ours higher, every seed" if min(hit) > 0
                else "ours lower, every seed" if max(hit) < 0 else "tie")
        lines.append(f"| {workload} | {n} | {len(seeds)} | {_stat([r.hit_rate for r in ours], 100, '{:.2f}%')} | "
                     f"{_stat([r.hit_rate for r in theirs], 100, '{:.2f}%')} | {_diff(hit, '{:+.2f}')} | "
                     f"{_diff(p99, '{:+.1f}')} | {_diff(mean, '{:+.1f}')} | {sign} |")
    return lines if len(lines) > 2 else []


def _diff(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.fmean(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"

