"""`hf-paged serve` under load, side by side with `transformers serve --continuous-batching`, in one run.

Both servers run the same model (the embedded byte-level tiny-lm by default) on 127.0.0.1, one after the other,
each started by this script on a free port and stopped at the end (SIGTERM, then SIGKILL). The workload is
open-loop: Poisson arrivals (seeded exponential gaps) at each of three rates, the same requests at a rate for
both servers, streamed from POST /v1/completions (the endpoint both accept for this model). Prompts are slices of
the Python standard library's held-out sources with long-tailed (lognormal, clipped) lengths; a share starts
with one shared system prompt, another share asks for a JSON object through `response_format` (transformers
serve rejects `response_format` on /v1/completions with 422, so it gets the same prompts without it: it does
less work on that share). Measured at the client from SSE chunk arrival times, per server and rate: completed
requests, errors by status, completed requests/s and output tokens/s over first arrival .. last completion,
TTFT, inter-token latency (gaps between content chunks) and end-to-end latency p50/p99; for hf-paged also the
prefix-cache hit rate (/metrics deltas) and the share of schema outputs that validate.

Also per rate: the server's CPU seconds per completed request (/proc/PID/stat; steadier than wall time when
other processes share the cores) and the 1-minute load average. The default rates suit a 2-core CPU: both keep
up at 2 req/s, transformers serve saturates near 3-4 req/s, hf-paged keeps up at 6 and is near its limit at 16.
The target printed at the end: at the highest rate, hf-paged completes >= 3x the baseline's requests/s at no
worse p99 TTFT, with 0 errors.

`--soak` runs hf-paged serve alone through many short requests (10% dropped mid-stream, 5% invalid) and checks
that every valid request completes, every invalid one gets a 4xx, the server's RSS after the soak is within 10%
of its RSS after a warm-up, and the KV cache drains to 0 used blocks.

    python benchmarks/serve_load.py                              # both servers, three rates (minutes on 2 cores)
    python benchmarks/serve_load.py --num-requests 20            # a quick look
    python benchmarks/serve_load.py --baseline hf-paged-nocache  # baseline: our server without prefix caching
    python benchmarks/serve_load.py --soak [--soak-requests 2000]

This file holds the load comparison and the command line; `serve_soak.py` holds the soak, and
`serve_common.py` the servers, the workload and the streaming client that both use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import print_table  # noqa: E402
from benchmarks.serve_common import (  # noqa: E402
    OBJECT_SCHEMA,
    RequestResult,
    Server,
    ServerFailed,
    ServerSpec,
    WorkItem,
    build_workload,
    completion_body,
    cpu_seconds,
    describe,
    hf_paged_spec,
    new_client,
    pct,
    running,
    scrape,
    send,
    to_markdown,
    transformers_spec,
)
from benchmarks.serve_soak import run_soak  # noqa: E402
from hf_paged.api.models import DEFAULT_MODEL_PATH  # noqa: E402

# hf-paged's own counters, reported as deltas over each rate (absent from transformers serve: no /metrics)
SERVER_COUNTERS = {"preemptions": "hf_paged:num_preemptions_total", "steps": "hf_paged:num_steps_total",
                   "computed_tokens": "hf_paged:computed_tokens_total"}


# -- the load benchmark ----------------------------------------------------------------------------------------

def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    rng, at, times = random.Random(seed), 0.0, []
    for _ in range(n):
        times.append(at)
        at += rng.expovariate(rate)
    return times


async def run_rate(server: Server, items: list[WorkItem], rate: float, args, seed: int) -> list[RequestResult]:
    """Open loop: each request goes out at its arrival time whatever the earlier ones are doing."""
    url = f"{server.url}/v1/completions"
    async with new_client() as http:
        start = time.perf_counter()

        async def one(item: WorkItem, at: float) -> RequestResult:
            if at > args.time_cap:
                return RequestResult(sent_at=start + at, error="not sent (time cap)")
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            left = args.time_cap - (time.perf_counter() - start)
            label = "time cap" if left < args.request_timeout else "timeout"
            return await send(http, url, min(left, args.request_timeout), body=completion_body(server, item),
                              timeout_label=label)

        arrivals = poisson_arrivals(len(items), rate, seed)
        return await asyncio.gather(*(one(item, at) for item, at in zip(items, arrivals)))


def schema_valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), OBJECT_SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def summarize(results: list[RequestResult], items: list[WorkItem], rate: float) -> dict:
    done = [r for r in results if r.error is None]
    sent = [r for r in results if r.error != "not sent (time cap)"]
    span = max((r.end for r in done), default=0.0) - min((r.sent_at for r in sent), default=0.0)
    ttft = [r.chunk_times[0] - r.sent_at for r in done if r.chunk_times]
    gaps = [b - a for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    e2e = [r.end - r.sent_at for r in done]
    schema_done = [r for r, item in zip(results, items) if item.schema and r.error is None]
    prompt = sum(r.prompt_tokens or 0 for r in done)
    return {
        "rate": rate, "requests": len(results), "completed": len(done),
        "errors": dict(Counter(r.error for r in results if r.error)),
        "error_examples": sorted({f"{r.error}: {r.detail[:300]}" for r in results if r.error and r.detail})[:5],
        "span_s": span, "req_per_s": len(done) / span if span > 0 else 0.0,
        "output_tokens": sum(r.output_tokens for r in done),
        "output_tokens_per_s": sum(r.output_tokens for r in done) / span if span > 0 else 0.0,
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "itl_p50_s": pct(gaps, 50),
        "itl_p99_s": pct(gaps, 99), "e2e_p50_s": pct(e2e, 50), "e2e_p99_s": pct(e2e, 99),
        "usage_cached_share": sum(r.cached_tokens or 0 for r in done) / prompt if prompt else None,
        "schema_completed": len(schema_done),
        "schema_valid": sum(schema_valid(r.text) for r in schema_done),
    }


def request_record(res: RequestResult, start: float) -> dict:
    """One request for the JSON output (times in seconds, `sent_s` from the first arrival)."""
    first = res.chunk_times[0] - res.sent_at if res.chunk_times else None
    return {"sent_s": res.sent_at - start, "status": res.status, "error": res.error, "ttft_s": first,
            "e2e_s": None if res.end is None else res.end - res.sent_at, "output_tokens": res.output_tokens,
            "prompt_tokens": res.prompt_tokens, "cached_tokens": res.cached_tokens}


def warm_up(server: Server, items: list[WorkItem]) -> None:
    """A few requests before any clock: first-call costs, the schema's compilation for servers that take it (and,
    for hf-paged, the shared system prompt in the prefix cache, as on a server that has been up for a while)."""
    picks = [i for i in items if i.schema][:1] + [i for i in items if not i.schema][:2]
    for item in picks:
        resp = httpx.post(f"{server.url}/v1/completions", json=completion_body(server, item, stream=False),
                          timeout=300, trust_env=False)
        if resp.status_code != 200:
            raise ServerFailed(f"warm-up POST /v1/completions got HTTP {resp.status_code}: {resp.text[:300]}")


def bench_server(spec: ServerSpec, workloads: dict[float, list[WorkItem]], args) -> list[dict]:
    print(f"\n== {spec.name}: {shlex.join(spec.argv)}", flush=True)
    rows = []
    with running(spec, args.ready_timeout) as server:
        warm_up(server, build_workload(args, 16, args.seed + 500))  # other prompts than the measured ones
        for index, (rate, items) in enumerate(workloads.items()):
            before, cpu = scrape(server), cpu_seconds(server.pid)
            results = asyncio.run(run_rate(server, items, rate, args, seed=args.seed + 1000 + index))
            after, cpu = scrape(server), cpu_seconds(server.pid) - cpu
            row = summarize(results, items, rate) | {"server": spec.name, "sends_schema": spec.sends_schema}
            row["server_cpu_s_per_request"] = cpu / row["completed"] if row["completed"] else None
            hits, queries = (after.get(k, 0) - before.get(k, 0) for k in
                             ("hf_paged:prefix_cache_hits_total", "hf_paged:prefix_cache_queries_total"))
            row["prefix_hit_rate"] = hits / queries if queries else None
            row |= {key: after[name] - before.get(name, 0) for key, name in SERVER_COUNTERS.items() if name in after}
            row["load_avg_1m"] = os.getloadavg()[0]
            first = min(r.sent_at for r in results)
            row["per_request"] = [request_record(r, first) for r in results]
            print(f"  rate {rate:g}/s: {row['completed']}/{row['requests']} completed in {row['span_s']:.1f} s, "
                  f"errors {row['errors'] or 0}, load average {row['load_avg_1m']:.1f}", flush=True)
            rows.append(row)
    return rows


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def ratio(ours: float | None, base: float | None) -> str:
    return "-" if not ours or not base else f"{ours / base:.2f}x"


def load_tables(rows: list[dict], ours: str, base: str) -> str:
    detail = [[r["server"], f"{r['rate']:g}", f"{r['completed']}/{r['requests']}",
               ", ".join(f"{k} x{v}" for k, v in r["errors"].items()) or "0", f"{r['req_per_s']:.2f}",
               f"{r['output_tokens_per_s']:.0f}", ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["itl_p50_s"]),
               ms(r["itl_p99_s"]), ms(r["e2e_p50_s"]), ms(r["e2e_p99_s"]), percent(r["prefix_hit_rate"]),
               f"{r['schema_valid']}/{r['schema_completed']}" if r["sends_schema"] else "not asked",
               "-" if r["server_cpu_s_per_request"] is None else f"{r['server_cpu_s_per_request']:.2f}",
               f"{r['load_avg_1m']:.1f}"]
              for r in rows]
    text = print_table(["server", "rate/s", "completed", "errors", "req/s", "out tok/s", "TTFT p50 ms",
                        "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "e2e p50 ms", "e2e p99 ms", "prefix hits",
                        "schema valid", "server CPU s/req", "load avg"], detail, title="\nper server and rate")
    by = {(r["server"], r["rate"]): r for r in rows}
    rates = sorted({r["rate"] for r in rows})
    pairs = [(by.get((ours, q)), by.get((base, q)), q) for q in rates]
    summary = [[f"{q:g}", f"{o['req_per_s']:.2f}", f"{b['req_per_s']:.2f}", ratio(o["req_per_s"], b["req_per_s"]),
                ms(o["ttft_p99_s"]), ms(b["ttft_p99_s"]), ratio(o["ttft_p99_s"], b["ttft_p99_s"])]
               for o, b, q in pairs if o and b]
    text += "\n" + print_table(["rate/s", f"{ours} req/s", f"{base} req/s", "req/s ours/base",
                                "ours TTFT p99 ms", "base TTFT p99 ms", "TTFT p99 ours/base"], summary,
                               title=f"\n{ours} vs {base}")
    return text


def target_verdict(rows: list[dict], ours: str, base: str) -> tuple[bool, str]:
    """At the highest rate: ours >= 3x the baseline's completed req/s, p99 TTFT no worse, 0 errors on ours."""
    top = max(r["rate"] for r in rows)
    o, b = (next(r for r in rows if r["server"] == name and r["rate"] == top) for name in (ours, base))
    checks = {
        f"req/s {o['req_per_s']:.2f} >= 3 x {b['req_per_s']:.2f}": o["req_per_s"] >= 3 * b["req_per_s"],
        f"TTFT p99 {ms(o['ttft_p99_s'])} ms <= {ms(b['ttft_p99_s'])} ms":
            o["ttft_p99_s"] is not None and (b["ttft_p99_s"] is None or o["ttft_p99_s"] <= b["ttft_p99_s"]),
        f"errors on ours {sum(o['errors'].values())} == 0": not o["errors"],
    }
    held = all(checks.values())
    lines = [f"  [{'ok' if ok else 'MISSED'}] {name}" for name, ok in checks.items()]
    return held, f"\ntarget at {top:g} req/s: {'HOLDS' if held else 'DOES NOT HOLD'}\n" + "\n".join(lines)


def run_load(args) -> tuple[dict, str]:
    workloads = {rate: build_workload(args, args.num_requests, args.seed + i) for i, rate in enumerate(args.rates)}
    # each spec is made just before its server starts: a port found free stays free for the shortest time
    base = hf_paged_spec(args, prefix_caching=False) if args.baseline == "hf-paged-nocache" else transformers_spec(args)
    try:
        base_rows = bench_server(base, workloads, args)
    except ServerFailed as exc:
        if args.baseline != "transformers":
            raise
        print(f"\ntransformers serve cannot serve this benchmark: {exc}\n"
              "falling back to `hf-paged serve --no-prefix-caching` as the baseline", flush=True)
        base = hf_paged_spec(args, prefix_caching=False)
        base_rows = bench_server(base, workloads, args)
    ours = hf_paged_spec(args, prefix_caching=True)
    rows = bench_server(ours, workloads, args) + base_rows
    note = ("" if base.sends_schema else f"\nnote: {base.name} got the schema requests without response_format "
            "(it rejects it on /v1/completions): it did less work on that share")
    held, verdict = target_verdict(rows, ours.name, base.name)
    text = load_tables(rows, ours.name, base.name) + note + verdict
    print(note + verdict)
    return {"rows": rows, "target_holds": held, "servers": {s.name: s.argv for s in (ours, base)}}, text


# -- command line ----------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL_PATH), help="a local model directory")
    p.add_argument("--baseline", choices=("transformers", "hf-paged-nocache"), default="transformers")
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 6.0, 16.0],
                   help="arrival rates, req/s (2-core CPU: transformers serve keeps up at 2, saturates near 3.5)")
    p.add_argument("--num-requests", type=int, default=60, help="requests per rate")
    p.add_argument("--time-cap", type=float, default=240.0, help="seconds per rate; later requests count as errors")
    p.add_argument("--request-timeout", type=float, default=180.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-median", type=int, default=200, help="bytes (= tokens for the default model)")
    p.add_argument("--prompt-max", type=int, default=1200)
    p.add_argument("--output-median", type=int, default=48, help="max_tokens, lognormal")
    p.add_argument("--output-max", type=int, default=256)
    p.add_argument("--system-prompt-bytes", type=int, default=600)
    p.add_argument("--shared-prefix-share", type=float, default=0.5)
    p.add_argument("--schema-share", type=float, default=0.1)
    p.add_argument("--block-size", type=int, default=16, help="KV block size, both servers")
    p.add_argument("--num-blocks", type=int, default=2048, help="KV blocks, both servers")
    p.add_argument("--max-batch-tokens", type=int, default=512, help="token budget of one step, both servers")
    p.add_argument("--max-num-seqs", type=int, default=64, help="hf-paged only (transformers has no such flag)")
    p.add_argument("--ours-args", default="", help="extra arguments for hf-paged serve (one string)")
    p.add_argument("--baseline-args", default="", help="extra arguments for transformers serve (one string)")
    p.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for GET /health")
    p.add_argument("--out", help="write the raw numbers to this JSON file")
    p.add_argument("--markdown", help="write the tables to this markdown file")
    soak = p.add_argument_group("soak (hf-paged serve alone)")
    soak.add_argument("--soak", action="store_true")
    soak.add_argument("--soak-requests", type=int, default=2000)
    soak.add_argument("--soak-warmup", type=int, default=100, help="requests before the first RSS reading")
    soak.add_argument("--soak-concurrency", type=int, default=24)
    soak.add_argument("--disconnect-share", type=float, default=0.10)
    soak.add_argument("--invalid-share", type=float, default=0.05)
    soak.add_argument("--max-429-retries", type=int, default=20)
    soak.add_argument("--drain-timeout", type=float, default=10.0, help="seconds for the KV cache to reach 0 blocks")
    return p.parse_args(argv)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: every server is stopped on the way out


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C even when started with SIGINT ignored (`&`)
    header = describe(args)
    print(header, flush=True)
    try:
        raw, body = run_soak(args) if args.soak else run_load(args)
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped", file=sys.stderr)
        return 130
    except ServerFailed as exc:
        print(f"\nerror: the server failed: {exc}", file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).write_text(json.dumps({"header": header, "args": vars(args)} | raw, indent=1, default=str))
    if args.markdown:
        title = "hf-paged serve soak" if args.soak else "hf-paged serve under load"
        Path(args.markdown).write_text(to_markdown(title, header, body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
