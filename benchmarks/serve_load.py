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
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import datetime
import functools
import json
import math
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import transformers
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.common import machine, print_table  # noqa: E402
from hf_paged.datasets import stdlib_documents  # noqa: E402
from hf_paged.models import DEFAULT_MODEL_PATH  # noqa: E402

MAX_POSITIONS = 2048  # the default model's max_position_embeddings (byte-level: one token per ASCII byte + BOS)
OBJECT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "size": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "size", "ok"],
    "additionalProperties": False,
}
# hf-paged's own counters, reported as deltas over each rate (absent from transformers serve: no /metrics)
SERVER_COUNTERS = {"preemptions": "hf_paged:num_preemptions_total", "steps": "hf_paged:num_steps_total",
                   "computed_tokens": "hf_paged:computed_tokens_total"}
SCHEMA_MAX_TOKENS = 96  # room for the whole object; schema requests are not long-tailed


# -- servers ---------------------------------------------------------------------------------------------------

class ServerFailed(RuntimeError):
    """The server did not start, died, or could not answer one warm-up request; the message says why."""


@dataclass(slots=True)
class ServerSpec:
    name: str  # label in the tables
    argv: list[str]  # the command, port included
    port: int
    sends_schema: bool  # whether schema requests carry `response_format`


@dataclass(slots=True)
class Server:
    spec: ServerSpec
    pid: int
    url: str  # http://127.0.0.1:PORT
    model: str  # the id GET /v1/models reports; requests name it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hf_paged_spec(args, *, prefix_caching: bool) -> ServerSpec:
    port = free_port()
    argv = [sys.executable, "-m", "hf_paged.cli", "serve", "--model", args.model, "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--block-size", str(args.block_size),
            "--num-blocks", str(args.num_blocks), "--max-num-batched-tokens", str(args.max_batch_tokens),
            "--max-num-seqs", str(args.max_num_seqs)]
    argv += ([] if prefix_caching else ["--no-prefix-caching"]) + shlex.split(args.ours_args)
    return ServerSpec("hf-paged" if prefix_caching else "hf-paged (no prefix cache)", argv, port, True)


def transformers_spec(args) -> ServerSpec:
    # fp32 like hf-paged (`--dtype auto` keeps the checkpoint's fp16, about 4x slower per token on CPU); explicit
    # cache sizes, the same as ours (left unset, it sizes the cache from free memory)
    port = free_port()
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", "--continuous-batching",
            "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32",
            "--cb-block-size", str(args.block_size), "--cb-num-blocks", str(args.num_blocks),
            "--cb-max-batch-tokens", str(args.max_batch_tokens), *shlex.split(args.baseline_args), args.model]
    return ServerSpec("transformers serve", argv, port, False)


def _die_with_parent() -> None:
    os.setsid()  # its own process group: one signal stops the server and any worker it starts
    try:  # Linux: SIGTERM the server if this script dies without running its finally blocks (SIGKILL)
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _log_tail(log: Path, lines: int = 30) -> str:
    text = log.read_text(errors="replace").strip().splitlines()
    return "\n".join("    " + line for line in text[-lines:]) or "    (no output)"


def _wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log: Path) -> str:
    """Poll GET /health until 200, then return the model id from GET /v1/models."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerFailed(f"exited with status {proc.returncode} before it was ready; its log ends:\n"
                               f"{_log_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                models = httpx.get(f"{url}/v1/models", timeout=10, trust_env=False).json()
                return models["data"][0]["id"]
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise ServerFailed(f"not ready after {timeout_s:.0f} s (GET /health); its log ends:\n{_log_tail(log)}")


def stop(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def running(spec: ServerSpec, ready_timeout_s: float) -> Iterator[Server]:
    """Start the server, wait until it is ready, and always stop it (also on errors and Ctrl-C)."""
    log = Path(tempfile.mkstemp(prefix=f"serve_load_{spec.port}_", suffix=".log")[1])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(spec.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=REPO, env=env, preexec_fn=_die_with_parent)
    try:
        url = f"http://127.0.0.1:{spec.port}"
        yield Server(spec, proc.pid, url, _wait_ready(proc, url, ready_timeout_s, log))
    finally:
        stop(proc)
    print(f"  ({spec.name} stopped; its log: {log})")


# -- workload --------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class WorkItem:
    prompt: str
    max_tokens: int
    shared_prefix: bool  # starts with the shared system prompt
    schema: bool  # asks for OBJECT_SCHEMA through response_format


@functools.cache
def corpus() -> str:
    """The stdlib's held-out sources as printable ASCII (one token per byte for the default model)."""
    docs = [d.text.encode("ascii", "replace").decode() for d in stdlib_documents("heldout")]
    return "\n".join(d for d in docs if len(d) > 4000)


class TextSource:
    """Seeded slices of `corpus()`."""

    def __init__(self, seed: int) -> None:
        self.text, self.rng = corpus(), random.Random(seed)

    def slice(self, num_bytes: int) -> str:
        start = self.rng.randrange(len(self.text) - num_bytes)
        return self.text[start:start + num_bytes]


def lognormal_int(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))


def build_workload(args, n: int, seed: int, *, output_range: tuple[int, int] | None = None) -> list[WorkItem]:
    """Long-tailed prompt and output lengths; `output_range` (uniform) replaces the lognormal outputs."""
    rng, text = random.Random(seed), TextSource(seed)
    system = "# System: answer with Python code.\n" + TextSource(args.seed).slice(args.system_prompt_bytes)
    items = []
    for _ in range(n):
        shared, schema = rng.random() < args.shared_prefix_share, rng.random() < args.schema_share
        if schema:
            max_tokens = min(SCHEMA_MAX_TOKENS, output_range[1]) if output_range else SCHEMA_MAX_TOKENS
        elif output_range:
            max_tokens = rng.randint(*output_range)
        else:
            max_tokens = lognormal_int(rng, args.output_median, 0.8, 4, args.output_max)
        room = MAX_POSITIONS - 1 - max_tokens - (len(system) if shared else 0)
        prompt = text.slice(lognormal_int(rng, args.prompt_median, 0.9, 16, min(args.prompt_max, room)))
        if schema:
            prompt += '\n# the result as JSON: {"name": ..., "size": ..., "ok": ...}\n'
        items.append(WorkItem((system if shared else "") + prompt, max_tokens, shared, schema))
    return items


def completion_body(server: Server, item: WorkItem, stream: bool = True) -> dict:
    body = {"model": server.model, "prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": 0.0,
            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if item.schema and server.spec.sends_schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "obj", "schema": OBJECT_SCHEMA}}
    return body


# -- one streamed request --------------------------------------------------------------------------------------

@dataclass(slots=True)
class RequestResult:
    sent_at: float  # perf_counter() when the request went out
    status: int | None = None  # HTTP status; None when no response came (timeout, connection error)
    error: str | None = None  # None: completed (finish_reason or [DONE] seen); else a short key for the tables
    detail: str = ""  # error body or exception, first 1000 characters
    chunk_times: list[float] = field(default_factory=list)  # perf_counter() of each chunk with content
    end: float | None = None  # perf_counter() when the stream ended
    text: str = ""
    output_tokens: int = 0  # usage.completion_tokens when given, else the content chunks
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    disconnected: bool = False  # closed by us mid-stream (soak)
    retry_after_s: float | None = None  # the Retry-After header of a 429
    retries_429: int = 0  # 429s answered to this request before this result (soak retries them)


def _read_usage(res: RequestResult, usage: dict) -> None:
    res.output_tokens = usage.get("completion_tokens", res.output_tokens)
    res.prompt_tokens = usage.get("prompt_tokens")
    res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


async def _stream(client: httpx.AsyncClient, url: str, res: RequestResult, body: dict | None, content: bytes | None,
                  disconnect_after: int | None) -> None:
    kwargs = {"json": body} if content is None else {"content": content,
                                                     "headers": {"content-type": "application/json"}}
    async with client.stream("POST", url, **kwargs) as resp:
        res.status = resp.status_code
        if resp.status_code != 200:
            res.error, res.detail = str(resp.status_code), (await resp.aread()).decode(errors="replace")[:1000]
            if resp.headers.get("retry-after", "").replace(".", "", 1).isdigit():
                res.retry_after_s = float(resp.headers["retry-after"])
            return
        finished = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                finished = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                res.error, res.detail = "error event", data[:1000]
                return
            if chunk.get("usage"):
                _read_usage(res, chunk["usage"])
            choice = (chunk.get("choices") or [{}])[0]
            if choice.get("text"):
                res.chunk_times.append(time.perf_counter())
                res.text += choice["text"]
                if disconnect_after is not None and len(res.chunk_times) >= disconnect_after:
                    res.disconnected = True
                    return  # leaving the `async with` closes the connection mid-stream
            finished = finished or bool(choice.get("finish_reason"))
        res.end = time.perf_counter()
        if res.prompt_tokens is None:
            res.output_tokens = len(res.chunk_times)
        if not finished:
            res.error = "stream cut"


async def send(client: httpx.AsyncClient, url: str, timeout_s: float, *, body: dict | None = None,
               content: bytes | None = None, disconnect_after: int | None = None, timeout_label: str = "timeout",
               ) -> RequestResult:
    """POST one streamed completion (a JSON `body`, or raw `content`) and time its chunks."""
    res = RequestResult(sent_at=time.perf_counter())
    try:
        await asyncio.wait_for(_stream(client, url, res, body, content, disconnect_after), timeout_s)
    except TimeoutError:
        res.error = timeout_label
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error, res.detail = type(exc).__name__, str(exc)[:1000]
    return res


def new_client() -> httpx.AsyncClient:
    # no client-side queueing under open-loop load; never a proxy: only 127.0.0.1
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=64)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=10), trust_env=False)


# -- metrics scraped from the server ---------------------------------------------------------------------------

def scrape(server: Server) -> dict[str, float]:
    """GET /metrics as {sample name: value summed over labels}; {} when the server has no /metrics or is gone."""
    try:
        resp = httpx.get(f"{server.url}/metrics", timeout=10, trust_env=False)
    except httpx.HTTPError:
        return {}
    if resp.status_code != 200:
        return {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads) so far: work done, whatever else runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


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


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


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


# -- the soak --------------------------------------------------------------------------------------------------

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


def describe(args) -> str:
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load = os.getloadavg()[0]
    busy = f" (busy: other processes share the {os.cpu_count()} cores, expect noisy numbers)" if load > 1.0 else ""
    lines = [f"machine: {machine()}, transformers {transformers.__version__}", f"date: {now}",
             f"load average at start: {load:.2f}{busy}",
             f"model: {args.model}", f"command: python {shlex.join(sys.argv)}",
             f"cache (both servers): block size {args.block_size}, {args.num_blocks} blocks, "
             f"{args.max_batch_tokens} tokens per step"]
    if args.soak:
        lines.append(f"soak: {args.soak_requests} requests after {args.soak_warmup} warm-up ones, max_tokens 1-32, "
                     f"{args.disconnect_share:.0%} dropped mid-stream, {args.invalid_share:.0%} invalid")
    else:
        lines.append(f"workload: {args.num_requests} requests per rate, Poisson arrivals at {args.rates} req/s, "
                     f"streamed /v1/completions, temperature 0; prompts lognormal median {args.prompt_median} "
                     f"bytes (16-{args.prompt_max}), max_tokens lognormal median {args.output_median} "
                     f"(4-{args.output_max}); {args.shared_prefix_share:.0%} start with a shared "
                     f"{args.system_prompt_bytes}-byte system prompt, {args.schema_share:.0%} ask for a JSON "
                     f"object (max_tokens {SCHEMA_MAX_TOKENS}); per rate at most {args.time_cap:.0f} s, per "
                     f"request {args.request_timeout:.0f} s")
    return "\n".join(lines)


def to_markdown(title: str, header: str, body: str) -> str:
    """The printed report as markdown: the header as a list, tables as printed, verdicts as a list."""
    lines = [f"# {title}", "", *(f"- {line}" for line in header.splitlines()), ""]
    for line in body.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif line.strip().startswith("["):
            lines.append(f"- {line.strip()}")
        elif line.strip():
            lines += ["", line.strip(), ""]
    return "\n".join(lines) + "\n"


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
