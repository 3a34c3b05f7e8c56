"""A soak of prefill/decode disaggregation (issue 39): 2,000 requests through 1 prefill + 1 decode replica of the
embedded tiny model, 10% of the clients leaving mid-stream, 5% invalid, and the prefill replica's actor killed once
mid-run (`ray.kill`; Serve starts a replacement).

    python benchmarks/pd_soak.py [--requests 2000] [--concurrency 8] [--out benchmarks/pd_soak_results.md]

The deployment is `deploy(replicas=2, prefill_replicas=1)` in this process (the `hf-paged serve --replicas 2
--prefill-replicas 1` app), on a local Ray cluster this script starts, so it can kill the prefill replica's actor and
find every Ray process it started. The workload and the per-request checks are the single-server soak's
(`serve_soak.py`: long-tailed short prompts, half behind a shared system prompt, most over one block; max_tokens 1-32;
streamed); the decode replica has a prompt budget per step (`max_prefill_tokens_per_step`), so the gateway's placement
rule (`pd_placement.py`) may prefill a prompt there. Checks:

- every request answered as asked: a valid one completes (200 and its end), an invalid one gets a 4xx with an OpenAI
  error body, a dropped one had started; a valid request that failed is acceptable only with an error body or an SSE
  error event (counted apart), never a hang, a cut stream or a bare connection error;
- after the run, `hf_paged:kv_cache_used_blocks` is 0 for every replica in `GET /metrics` (both roles), and the
  gateway's placement ledger holds no tokens (`hf_paged:pd_queued_prefill_tokens`);
- each replica's RSS at the end is within 10% of its RSS after the warm-up (the replacement prefill replica is
  compared with the one it replaced);
- after `serve.shutdown()` and `ray.shutdown()`, none of the Ray processes seen during the run is left.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from argparse import Namespace
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.serve_common import Server, ServerSpec, free_port
from benchmarks.serve_soak import SoakItem, openai_error, soak_batch, soak_items, soak_ok, soak_report

ROLES = ("PrefillReplica", "EngineReplica")  # the deployments' names: prefill, decode


def replica_pids() -> dict[str, list[int]]:
    """The live processes of each role's replicas (Ray names a Serve replica's worker `ray::ServeReplica:...`)."""
    found: dict[str, list[int]] = {role: [] for role in ROLES}
    for proc in psutil.Process().children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        for role in ROLES:
            if f"ServeReplica:hf_paged:{role}" in line and proc.status() != psutil.STATUS_ZOMBIE:
                found[role].append(proc.pid)
    return found


def rss_mib(pid: int) -> dict[str, float]:
    """VmRSS and its parts (MiB): RssAnon (the process's own heap), RssShmem (shared memory it touched: Ray's
    object store arena, where blocks handed over live)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "RssAnon", "RssShmem")))
    return {k: int(v.split()[0]) / 1024 for k, v in fields.items()}


def metrics(url: str) -> list[tuple[str, dict, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30, trust_env=False).text
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def used_blocks(url: str) -> dict[str, float]:
    """`hf_paged:kv_cache_used_blocks` of every replica the gateway scraped, by replica tag."""
    return {labels.get("replica", "?"): v for name, labels, v in metrics(url) if name == "hf_paged:kv_cache_used_blocks"}


def total(url: str, name: str) -> float:
    return sum(v for n, _, v in metrics(url) if n == name)


def wait_drained(url: str, timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        used = used_blocks(url)
        if (len(used) >= 2 and not any(used.values())) or time.monotonic() > deadline:
            return used
        time.sleep(0.5)


async def kill_prefill_when(url: str, placed: float, log: list[str]) -> None:
    """Kill the prefill replica's actor once the gateway has placed `placed` prompts (requests in flight)."""
    import ray

    names = ("hf_paged:pd_prefills_total", "hf_paged:pd_prefills_local_total", "hf_paged:pd_prefills_skipped_total",
             "hf_paged:pd_prefill_failures_total")
    while sum([await asyncio.to_thread(total, url, n) for n in names]) < placed:
        await asyncio.sleep(1.0)
    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "#PrefillReplica#" in a["name"])
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    log.append(f"killed {name} at {time.strftime('%H:%M:%S')} after {placed:.0f} placements")


def classify(item: SoakItem, res) -> str:
    if soak_ok(item, res):
        return "as asked"
    if item.kind == "valid" and (res.error == "error event" or openai_error(res.detail)):
        return "failed with an error body"
    return "BAD"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100, help="requests before the first RSS reading")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kill-at", type=float, default=0.3, help="kill the prefill replica after this share of requests")
    p.add_argument("--budget", type=int, default=32, help="max_prefill_tokens_per_step (the decode side's budget)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    # the single-server soak's knobs (serve_soak.soak_items / build_workload / soak_batch read these names)
    args = Namespace(seed=a.seed, disconnect_share=0.10, invalid_share=0.05, soak_concurrency=a.concurrency,
                     max_429_retries=20, request_timeout=300.0, prompt_median=48, prompt_max=400,
                     system_prompt_bytes=160, shared_prefix_share=0.5, schema_share=0.0)
    import ray
    from ray import serve

    from hf_paged.scaleout.deploy import deploy, worker_env
    from hf_paged.scaleout.gateway import wait_until_ready

    started = time.monotonic()
    # Serve kills a proxy not ready within 5 s (its default), which a loaded machine misses; the local cluster's
    # processes inherit this environment
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=worker_env(), log_to_driver=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    paged = {"block_size": 16, "num_blocks": 512, "max_prefill_tokens_per_step": a.budget}
    handle = deploy(None, replicas=2, prefill_replicas=1, port=port, paged=paged, torch_threads=1)
    ready = wait_until_ready(handle, 120)
    assert ready.ready, ready.message
    model = httpx.get(f"{url}/v1/models", timeout=30, trust_env=False).json()["data"][0]["id"]
    server = Server(ServerSpec("hf-paged PD", [], port, True), os.getpid(), url, model)
    seen = {proc.pid for proc in psutil.Process().children(recursive=True)}  # Ray's processes (and their workers)

    asyncio.run(soak_batch(server, soak_items(args, server, a.warmup, a.seed + 7), args))
    wait_drained(url, 60)
    pids = replica_pids()
    rss_before = {role: rss_mib(pids[role][0]) for role in ROLES}
    before_pids = {role: pids[role][0] for role in ROLES}

    items = soak_items(args, server, a.requests, a.seed + 8)
    log: list[str] = []

    async def run():
        killer = asyncio.create_task(kill_prefill_when(url, a.warmup + a.kill_at * a.requests, log))
        results = await soak_batch(server, items, args)
        if not killer.done():
            killer.cancel()
            log.append("the run ended before the kill point: no kill")
        return results

    start = time.perf_counter()
    results = asyncio.run(run())
    elapsed = time.perf_counter() - start
    used = wait_drained(url, 60)
    queued = sum(v for n, _, v in metrics(url) if n == "hf_paged:pd_queued_prefill_tokens")
    counters = {n.removeprefix("hf_paged:").removesuffix("_total"): total(url, n) for n in (
        "hf_paged:pd_prefills_total", "hf_paged:pd_prefill_failures_total", "hf_paged:pd_prefills_local_total",
        "hf_paged:pd_prefills_skipped_total", "hf_paged:kv_transfer_loaded_blocks_total")}
    seen |= {proc.pid for proc in psutil.Process().children(recursive=True)}
    pids = replica_pids()
    rss_after = {role: rss_mib(pids[role][0]) for role in ROLES}
    replaced = pids["PrefillReplica"][0] != before_pids["PrefillReplica"]

    serve.shutdown()
    ray.shutdown()
    deadline = time.monotonic() + 60
    while (left := [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status()
                    != psutil.STATUS_ZOMBIE]) and time.monotonic() < deadline:
        time.sleep(0.5)
    total_s = time.monotonic() - started

    rows, anomalies = soak_report(items, results)
    outcome = {c: sum(classify(i, r) == c for i, r in zip(items, results))
               for c in ("as asked", "failed with an error body", "BAD")}
    table = print_table(["kind", "sent", "as expected", "statuses", "dropped by us", "429 retries"], rows,
                        title=f"{len(items)} requests in {elapsed:.1f} s ({len(items) / elapsed:.1f} req/s, "
                              f"{a.concurrency} in flight at most), after {a.warmup} warm-up requests:")
    checks = {
        f"every request answered as asked ({outcome['as asked']}) or failed with an error body "
        f"({outcome['failed with an error body']}); no hang, cut stream or bare error ({outcome['BAD']})":
            outcome["BAD"] == 0,
        f"the prefill replica was killed mid-run and replaced ({'; '.join(log)}; replacement "
        f"{'running' if replaced else 'NOT seen'})": replaced and bool(log) and log[0].startswith("killed"),
        f"hf_paged:kv_cache_used_blocks after the run: {used} (want 0 on both replicas)":
            len(used) == 2 and not any(used.values()),
        f"the gateway's placement ledger holds {queued:.0f} tokens (want 0)": queued == 0,
        **{f"{role} RSS {rss_before[role]['VmRSS']:.0f} MiB after warm-up -> {rss_after[role]['VmRSS']:.0f} MiB "
           f"at the end ({rss_after[role]['VmRSS'] / rss_before[role]['VmRSS']:.3f}x) within 10% (of it: own heap, "
           f"RssAnon, {rss_before[role]['RssAnon']:.0f} -> {rss_after[role]['RssAnon']:.0f} MiB; shared memory "
           f"touched, RssShmem, {rss_before[role]['RssShmem']:.0f} -> {rss_after[role]['RssShmem']:.0f} MiB)":
           rss_after[role]["VmRSS"] <= 1.10 * rss_before[role]["VmRSS"] for role in ROLES},
        f"{len(seen)} Ray processes seen; {len(left)} left 60 s after serve.shutdown() + ray.shutdown()": not left,
    }
    verdict = "\n".join(f"- [{'ok' if ok else 'MISSED'}] {name}" for name, ok in checks.items())
    placed = (f"Gateway counters: {counters}. Whole run (Ray start to processes gone): {total_s:.0f} s. Load "
              f"average (1 min) at the end: {os.getloadavg()[0]:.1f}.")
    print(table, verdict, placed, sep="\n")
    if anomalies:
        print("anomalies (first 20):", *anomalies[:20], sep="\n")
    if a.out:
        command = f"python benchmarks/pd_soak.py --requests {a.requests} --concurrency {a.concurrency} " \
                  f"--kill-at {a.kill_at} --budget {a.budget} --seed {a.seed} --out {a.out}"
        a.out.write_text(f"# Prefill/decode disaggregation soak\n\n`{command}` on {machine()}, "
                         f"{time.strftime('%Y-%m-%d')}.\n\n1 prefill + 1 decode replica of the embedded tiny model "
                         f"(block size 16, 512 blocks, max_prefill_tokens_per_step {a.budget}, one torch thread "
                         f"each), Ray local cluster (2 CPUs); streamed /v1/completions, temperature 0, max_tokens "
                         f"1-32, prompts 16-400 bytes (median 48) with half behind a 160-byte shared system prompt; "
                         f"10% dropped mid-stream, 5% invalid.\n\n{table}\n\n{verdict}\n\n{placed}\n"
                         + ("\nAnomalies (first 20):\n\n" + "\n".join(f"    {x}" for x in anomalies[:20]) + "\n"
                            if anomalies else ""))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
