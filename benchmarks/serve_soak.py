"""The soak (`python benchmarks/serve_load.py --soak`): hf-paged serve alone through many short requests.

A share of the requests is dropped mid-stream and a share is invalid (`INVALID_KINDS`); `run_soak` checks that
every valid request completes, every invalid one gets a 4xx with an OpenAI error body, the server's RSS after
the soak is within 10% of its RSS after a warm-up, and the KV cache drains to 0 used blocks.
"""

from __future__ import annotations

import asyncio
import json
import random
import shlex
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from benchmarks.common import print_table
from benchmarks.serve_common import (
    MAX_POSITIONS,
    RequestResult,
    Server,
    build_workload,
    completion_body,
    hf_paged_spec,
    new_client,
    rss_mib,
    running,
    scrape,
    send,
)

INVALID_KINDS = ("max_tokens 0", "max_tokens -3", "temperature -1", "malformed JSON", 'max_tokens "ten"',
                 f"prompt > {MAX_POSITIONS} positions")


@dataclass(slots=True)
class SoakItem:
    kind: str  # "valid", "disconnect" or one of INVALID_KINDS
    body: dict | None  # the JSON body; None when `content` is sent instead
    content: bytes | None = None  # a raw body (the malformed JSON)
    disconnect_after: int | None = None  # close the stream after this many content chunks


def invalid_item(kind: str, body: dict) -> SoakItem:
    if kind == "malformed JSON":
        return SoakItem(kind, None, content=json.dumps(body)[:-7].encode())
    changes = {"max_tokens 0": {"max_tokens": 0}, "max_tokens -3": {"max_tokens": -3},
               "temperature -1": {"temperature": -1.0}, 'max_tokens "ten"': {"max_tokens": "ten"},
               INVALID_KINDS[-1]: {"prompt": (body["prompt"] * (3000 // len(body["prompt"]) + 1))[:3000]}}
    return SoakItem(kind, body | changes[kind])


def soak_items(args, server: Server, n: int, seed: int) -> list[SoakItem]:
    rng = random.Random(seed)
    num_drop, num_bad = round(n * args.disconnect_share), round(n * args.invalid_share)
    kinds = ["disconnect"] * num_drop + ["invalid"] * num_bad + ["valid"] * (n - num_drop - num_bad)
    rng.shuffle(kinds)
    items, invalid = [], iter(INVALID_KINDS * n)  # the invalid kinds in turn
    for kind, work in zip(kinds, build_workload(args, n, seed, output_range=(1, 32))):
        if kind == "disconnect":
            work.max_tokens = max(work.max_tokens, 8)  # room to drop the stream before its end
            items.append(SoakItem(kind, completion_body(server, work),
                                  disconnect_after=rng.randint(1, work.max_tokens - 1)))
        elif kind == "invalid":
            items.append(invalid_item(next(invalid), completion_body(server, work)))
        else:
            items.append(SoakItem(kind, completion_body(server, work)))
    return items


async def soak_batch(server: Server, items: list[SoakItem], args) -> list[RequestResult]:
    """At most `--soak-concurrency` requests in flight; a 429 is retried after its Retry-After."""
    url, gate = f"{server.url}/v1/completions", asyncio.Semaphore(args.soak_concurrency)

    async def one(http: httpx.AsyncClient, item: SoakItem) -> RequestResult:
        async with gate:
            for retries in range(args.max_429_retries + 1):
                res = await send(http, url, args.request_timeout, body=item.body, content=item.content,
                                 disconnect_after=item.disconnect_after)
                res.retries_429 = retries
                if res.status != 429:
                    break
                await asyncio.sleep(res.retry_after_s or 0.5)
            return res

    async with new_client() as http:
        return await asyncio.gather(*(one(http, item) for item in items))


def openai_error(body: str) -> bool:
    """Whether `body` is an OpenAI error object: {"error": {"message", "type", "param", "code"}}."""
    try:
        error = json.loads(body)["error"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= error.keys()


def soak_ok(item: SoakItem, res: RequestResult) -> bool:
    if item.kind == "valid":
        return res.error is None
    if item.kind == "disconnect":
        return res.status == 200 and (res.disconnected or res.error is None)
    return res.status is not None and 400 <= res.status < 500 and openai_error(res.detail)


def wait_drained(server: Server, timeout_s: float) -> tuple[float | None, float]:
    """Poll `hf_paged:kv_cache_used_blocks` until 0: (last value read or None when absent, seconds waited)."""
    start = time.perf_counter()
    while True:
        used = scrape(server).get("hf_paged:kv_cache_used_blocks")
        waited = time.perf_counter() - start
        if used is None or used == 0 or waited > timeout_s:
            return used, waited
        time.sleep(0.1)


def soak_report(items: list[SoakItem], results: list[RequestResult]) -> tuple[list[list], list[str]]:
    rows, anomalies = [], []
    for kind in ("valid", "disconnect", *INVALID_KINDS):
        pairs = [(i, r) for i, r in zip(items, results) if i.kind == kind]
        if not pairs:
            continue
        statuses = Counter(str(r.status) if r.error is None or r.status else r.error for _, r in pairs)
        good = sum(soak_ok(i, r) for i, r in pairs)
        rows.append([kind, len(pairs), good, ", ".join(f"{k} x{v}" for k, v in sorted(statuses.items())),
                     sum(r.disconnected for _, r in pairs), sum(r.retries_429 for _, r in pairs)])
        anomalies += [f"{kind}: {r.error or r.status} {r.detail[:300]!r} for {i.body or i.content!r:.200}"
                      for i, r in pairs if not soak_ok(i, r)]
    return rows, anomalies


def run_soak(args) -> tuple[dict, str]:
    spec = hf_paged_spec(args, prefix_caching=True)
    print(f"\n== {spec.name}: {shlex.join(spec.argv)}", flush=True)
    with running(spec, args.ready_timeout) as server:
        asyncio.run(soak_batch(server, soak_items(args, server, args.soak_warmup, args.seed + 7), args))
        wait_drained(server, args.drain_timeout)
        rss_before = rss_mib(server.pid)
        items = soak_items(args, server, args.soak_requests, args.seed + 8)
        start = time.perf_counter()
        results = asyncio.run(soak_batch(server, items, args))
        elapsed = time.perf_counter() - start
        used, waited = wait_drained(server, args.drain_timeout)
        rss_after, rss_peak = rss_mib(server.pid), rss_mib(server.pid, "VmHWM")
        healthy = httpx.get(f"{server.url}/health", timeout=10, trust_env=False).status_code == 200
    rows, anomalies = soak_report(items, results)
    table = print_table(["kind", "sent", "as expected", "statuses", "dropped by us", "429 retries"], rows,
                        title=f"\nsoak: {len(items)} requests in {elapsed:.1f} s "
                              f"({len(items) / elapsed:.1f} req/s, {args.soak_concurrency} in flight at most)")
    checks = {
        "every valid request completed, every invalid one got a 4xx with an OpenAI error body, every dropped "
        "stream started": not anomalies,
        f"RSS {rss_before:.0f} MiB after warm-up -> {rss_after:.0f} MiB after the soak "
        f"({rss_after / rss_before:.3f}x, peak {rss_peak:.0f} MiB) within 10%": rss_after <= 1.10 * rss_before,
        f"hf_paged:kv_cache_used_blocks = {used} after {waited:.1f} s (want 0)": used == 0,
        "GET /health 200 after the soak": healthy,
    }
    verdict = "\n".join(f"  [{'ok' if ok else 'MISSED'}] {name}" for name, ok in checks.items())
    text = f"{verdict}\n" + ("anomalies (first 20):\n" + "\n".join(anomalies[:20]) if anomalies else "")
    print(text)
    raw = {"rows": rows, "anomalies": anomalies, "elapsed_s": elapsed, "rss_before_mib": rss_before,
           "rss_after_mib": rss_after, "rss_peak_mib": rss_peak, "kv_cache_used_blocks": used,
           "checks": checks, "server": spec.argv}
    return raw, table + "\n" + text
