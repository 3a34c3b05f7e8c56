"""A real multi-replica run (issue 20, point 4): 2 engine replicas of the tiny model on a local Ray cluster, a
shared-prefix chat workload through the HTTP endpoint, our cache-aware router vs Ray Serve's default power of two.

    python benchmarks/routing_ray.py [--sessions 24] [--systems 6] [--turns 3] [--num-blocks 1024] [--out FILE]

Each router gets a fresh application (fresh caches) on the same Ray cluster, in the same run, with the same
requests: `--sessions` chats, each under one of `--systems` system prompts (~700 byte-level tokens each) and
`--turns` turns that resend the history, `--concurrency` clients at once. Prefix hit rate is the replicas' own
count (the `cached_tokens` of each answer's usage).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402

from hf_paged.scaleout.deploy import ReplicaSpec, build_application, worker_env  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_sessions(num_sessions: int, num_systems: int, seed: int) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    words = "cache block prefix replica router token batch engine queue paged radix tree hot cold".split()
    systems = [f"System {k}: " + " ".join(rng.choice(words) for _ in range(110)) for k in range(num_systems)]
    return [(systems[i % num_systems], [f"Question {i}.{t}: " + " ".join(rng.choice(words) for _ in range(8))
                                        for t in range(8)]) for i in range(num_sessions)]


def run_workload(url: str, sessions, turns: int, concurrency: int, max_tokens: int) -> dict:
    lock, stats = threading.Lock(), {"prompt": 0, "cached": 0, "completion": 0, "latency": [], "errors": 0,
                                     "replicas": {}}
    queue = list(enumerate(sessions))

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    _, (system, questions) = queue.pop(0)
                messages = [{"role": "system", "content": system}]
                for turn in range(turns):
                    messages.append({"role": "user", "content": questions[turn]})
                    start = time.perf_counter()
                    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens,
                                                                  "temperature": 0})
                    elapsed = time.perf_counter() - start
                    with lock:
                        if r.status_code != 200:
                            stats["errors"] += 1
                            break
                        usage = r.json()["usage"]
                        stats["prompt"] += usage["prompt_tokens"]
                        stats["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
                        stats["completion"] += usage["completion_tokens"]
                        stats["latency"].append(elapsed)
                        tag = r.headers.get("x-hf-paged-replica", "?")
                        stats["replicas"][tag] = stats["replicas"].get(tag, 0) + 1
                    messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats["wall"] = time.perf_counter() - start
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--systems", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=1024, help="KV blocks (of 16 tokens) per replica")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    sessions = make_sessions(args.sessions, args.systems, args.seed)
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=worker_env(), log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    spec = ReplicaSpec(paged={"block_size": 16, "num_blocks": args.num_blocks}, torch_threads=1)
    rows = []
    try:
        for router in ("pow2", "cache_aware"):
            serve.run(build_application(spec, replicas=2, router=router), name="hf_paged", route_prefix="/")
            run_workload(f"http://127.0.0.1:{port}", sessions[:2], 1, 1, 2)  # warm both code paths (not counted)
            serve.delete("hf_paged")
            serve.run(build_application(spec, replicas=2, router=router), name="hf_paged", route_prefix="/")
            s = run_workload(f"http://127.0.0.1:{port}", sessions, args.turns, args.concurrency, args.max_tokens)
            serve.delete("hf_paged")
            n = len(s["latency"])
            rows.append((router, n, s["errors"], s["cached"] / max(1, s["prompt"]), n / s["wall"],
                         s["completion"] / s["wall"], statistics.median(s["latency"]) * 1e3,
                         sorted(s["latency"])[int(0.9 * (n - 1))] * 1e3, sorted(s["replicas"].values())))
            print(f"  {router}: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    names = {"pow2": "Ray default (power of two)", "cache_aware": "ours (HfPagedRequestRouter)"}
    lines = [
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, ray {ray.__version__}, "
        f"python {platform.python_version()}",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"command: python benchmarks/routing_ray.py --sessions {args.sessions} --systems {args.systems} --turns "
        f"{args.turns} --concurrency {args.concurrency} --max-tokens {args.max_tokens} --num-blocks {args.num_blocks}",
        f"setup: local Ray (num_cpus=2), 2 EngineReplica x tiny-lm (fp32, 1 torch thread each, {args.num_blocks} "
        "blocks of 16 tokens), 1 gateway; HTTP through Serve's proxy",
        "",
        "| router | requests | errors | prefix hit rate | requests/s | completion tokens/s | p50 latency ms | "
        "p90 latency ms | requests per replica |",
        "|---|---|---|---|---|---|---|---|---|",
        *(f"| {names[r]} | {n} | {e} | {h:.1%} | {rps:.2f} | {tps:.1f} | {p50:.0f} | {p90:.0f} | {per} |"
          for r, n, e, h, rps, tps, p50, p90, per in rows),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
