"""What the load comparison (`serve_load.py`) and the soak (`serve_soak.py`) share.

- servers: `ServerSpec` (the command line of `hf-paged serve` or `transformers serve --continuous-batching` on a
  free port); `running()` starts one in its own process group, waits for GET /health and always stops it
  (SIGTERM, then SIGKILL); `ServerFailed` says why one did not start or serve;
- the workload: `WorkItem`s cut from the stdlib's held-out sources (`corpus`, `TextSource`, `build_workload`)
  and their POST /v1/completions bodies (`completion_body`);
- one streamed request: `send` times its SSE chunks into a `RequestResult`;
- readings: /metrics (`scrape`), /proc (`cpu_seconds`, `rss_mib`), percentiles (`pct`);
- the report: the header both modes print (`describe`) and the markdown file (`to_markdown`).
"""

from __future__ import annotations

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import transformers
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import machine
from hf_paged.cli.datasets import stdlib_documents

REPO = Path(__file__).resolve().parent.parent

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


def die_with_parent() -> None:
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
                                cwd=REPO, env=env, preexec_fn=die_with_parent)
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


# -- readings: /metrics, /proc, percentiles --------------------------------------------------------------------

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


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


# -- the report ------------------------------------------------------------------------------------------------

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
