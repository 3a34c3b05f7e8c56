"""The server's Prometheus metrics (vLLM's naming under `hf_paged:`) and the health summary of `/health?detail=1`.

Two sources:
- the engine's own state and counters, read as one snapshot per scrape (`refresh`, under the engine's lock, from a
  worker thread so a long step never blocks the event loop): requests running/waiting, KV blocks, prefix-cache
  queries and hits, preemptions, token counters, batch utilisation;
- latencies the server observes as a client would (from the moment the HTTP request arrived): time to first token,
  inter-token latency, end-to-end latency, and finished requests by reason; and, as each choice ends, two the
  engine's clock measured (its `RequestOutput`): queue time (arrival in the engine to first step) and time per
  output token.
Each server has its own registry (several servers may live in one process, e.g. in tests).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hf_paged.batching.engine_loop import EngineLoop
from hf_paged.batching.request import RequestOutput, fork_parent
from hf_paged.batching.retry import num_generated_tokens

__all__ = ["HEALTH_TARGETS", "ServerMetrics"]

# Our design notes' health figures: (engine stat, comparison, threshold, what it says).
HEALTH_TARGETS = {
    "prefix_hit_rate": ("prefix_hit_rate", ">", 0.80, "prompt tokens served from the prefix cache"),
    "batch_utilization": ("recent_batch_utilization", ">", 0.75, "tokens per step / token budget, last 256 steps; None when idle"),
    "memory_pressure": ("kv_usage", "<", 0.90, "KV blocks in use / blocks in the pool"),
}
# Seconds. TTFT and e2e end where vLLM v1's do (e2e: its very bounds): a latency past the last finite bound lands
# in +Inf, where histogram_quantile() can only answer that bound (a 2-minute generation or a request queued 3
# minutes behind a long queue read "80 s" when every histogram stopped there).
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)  # between two deliveries of one request
_TTFT_BUCKETS = _LATENCY_BUCKETS + (160.0, 640.0, 2560.0)  # queueing included
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)
_PREFIX = "hf_paged:"
_FINISHED_REASONS = ("stop", "length")  # request_success's label values (an aborted choice is request_aborted)


class ServerMetrics:
    def __init__(self, loop: EngineLoop, model_name: str) -> None:
        self.loop = loop
        self.model_name = model_name
        self.registry = CollectorRegistry()
        labels = {"labelnames": ["model_name"], "registry": self.registry}
        self.ttft = Histogram(f"{_PREFIX}time_to_first_token_seconds", "Time from request arrival to its first token",
                              buckets=_TTFT_BUCKETS, **labels).labels(model_name)
        self.itl = Histogram(f"{_PREFIX}inter_token_latency_seconds", "Time between two token deliveries of a request",
                             buckets=_LATENCY_BUCKETS, **labels).labels(model_name)
        self.e2e = Histogram(f"{_PREFIX}e2e_request_latency_seconds", "Time from request arrival to its last token",
                             buckets=_E2E_BUCKETS, **labels).labels(model_name)
        self.queue = Histogram(f"{_PREFIX}request_queue_time_seconds",
                               "Time a request waited from its arrival in the engine to its first step",
                               buckets=_TTFT_BUCKETS, **labels).labels(model_name)  # (a part of its TTFT)
        self.tpot = Histogram(f"{_PREFIX}request_time_per_output_token_seconds",
                              "A choice's mean time per output token after its first (its decode time / (tokens - 1))",
                              buckets=_LATENCY_BUCKETS, **labels).labels(model_name)
        self.success = Counter(f"{_PREFIX}request_success", "Finished requests (choices) by finish reason",
                               labelnames=["model_name", "finished_reason"], registry=self.registry)
        for reason in _FINISHED_REASONS:  # at 0 from the start (as vLLM): rate() sees the first one finish
            self.success.labels(model_name, reason)
        self.rejected = Counter(f"{_PREFIX}request_rejected", "Requests answered with an HTTP error, by status",
                                labelnames=["model_name", "status"], registry=self.registry)
        self.snapshot: dict[str, Any] = {}
        self.retention = None  # the server's PrefixRetention (its refused pins are reported)
        self._steps_at_read: int | None = None  # engine steps at the last read of the figures
        self._window_start = 0  # batch utilisation counts the steps after this one (the last idle read's)
        self.registry.register(_EngineCollector(self))

    # -- observations (event loop thread) ------------------------------------------------------------------
    def observe_tokens(self, gap: float | None, since_arrival: float) -> None:
        """A delivery of tokens: the first of a request (gap None) or a later one."""
        if gap is None:
            self.ttft.observe(since_arrival)
        else:
            self.itl.observe(gap)

    def observe_finished(self, reason: str, e2e: float, output: RequestOutput | None = None) -> None:
        """A choice that ended with `reason` ("stop", "length"), `e2e` seconds after its HTTP request arrived;
        `output` (the engine's) gives its time per output token and, for a request (not a fork: forks start on
        their parent's blocks, never queued), its queue time, as the engine's clock measured them."""
        self.success.labels(self.model_name, reason).inc()
        self.e2e.observe(e2e)
        if output is None:
            return
        if output.scheduled_time >= 0 and fork_parent(output.request_id) == output.request_id:
            self.queue.observe(max(0.0, output.scheduled_time - output.created_time))
        first, finish = output.lifespan
        num_tokens = num_generated_tokens(output)  # max_retries: every attempt's (lifespan starts at the first's)
        if first >= 0 and finish >= first and num_tokens > 1:
            self.tpot.observe((finish - first) / (num_tokens - 1))

    def observe_rejected(self, status: int) -> None:
        self.rejected.labels(self.model_name, str(status)).inc()

    # -- reading (worker thread) ---------------------------------------------------------------------------
    def refresh(self) -> dict[str, Any]:
        """Take a snapshot of the engine's figures (waits for the step in progress)."""
        stats = self.loop.engine.stats()
        stats["requests_waiting"] = self.loop.num_waiting
        queried = stats["prompt_tokens_queried"]
        stats["prefix_hit_rate"] = stats["prompt_tokens_cached"] / queried if queried else None
        stats["cache_retention_refused"] = self.retention.num_refused if self.retention is not None else 0
        self._recent_utilization(stats)
        self.snapshot = stats
        return stats

    def _recent_utilization(self, stats: dict[str, Any]) -> None:
        """`recent_batch_utilization` over the engine's last steps (at most 256) since the server was last seen
        idle: a read (/health, /metrics) that finds no step run since the previous read and nothing running or
        waiting restarts the window, so an idle server reads None (no sample: idle), not its last busy figure;
        `batch_utilization_steps` is the window's size."""
        steps = stats["steps"]
        if steps == self._steps_at_read and not stats["requests_running"] and not stats["requests_waiting"]:
            self._window_start = steps
        self._steps_at_read = steps
        recent = list(self.loop.engine.metrics.recent_step_tokens)  # one C-level copy (the step thread appends)
        window = max(0, min(len(recent), steps - self._window_start))
        budget = self.loop.engine.config.max_num_batched_tokens
        stats["recent_batch_utilization"] = sum(recent[len(recent) - window:]) / (window * budget) if window else None
        stats["batch_utilization_steps"] = window

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)

    def health(self) -> dict[str, Any]:
        """The three health figures, each with its threshold and whether it holds (None: no sample yet)."""
        stats = self.refresh()
        checks = {}
        for name, (key, op, threshold, meaning) in HEALTH_TARGETS.items():
            value = stats.get(key)
            holds = None if value is None else (value > threshold if op == ">" else value < threshold)
            checks[name] = {"value": value, "comparison": op, "threshold": threshold, "holds": holds,
                            "meaning": meaning}
        checks["batch_utilization"]["steps"] = stats["batch_utilization_steps"]  # its window (0: idle)
        return {"status": "ok" if self.loop.is_alive else "down", "engine_loop_alive": self.loop.is_alive,
                "requests_running": stats["requests_running"], "requests_waiting": stats["requests_waiting"],
                "checks": checks}


class _EngineCollector:
    """Exposes the last engine snapshot (taken by `ServerMetrics.refresh` just before each scrape)."""

    _FAMILIES = (  # (family, name, engine stat, help); counters get Prometheus' `_total` suffix
        (GaugeMetricFamily, "num_requests_running", "requests_running", "Requests in the running batch"),
        (GaugeMetricFamily, "num_requests_waiting", "requests_waiting", "Requests queued, not yet running"),
        (GaugeMetricFamily, "num_requests_swapped", "requests_swapped",
         "Preempted requests whose KV waits in CPU memory (preemption_mode='swap'; also counted as waiting)"),
        (GaugeMetricFamily, "kv_cache_usage_perc", "kv_usage", "KV-cache usage: blocks in use / total (1 = full)"),
        (GaugeMetricFamily, "kv_cache_used_blocks", "blocks_used", "KV blocks held by live requests"),
        (GaugeMetricFamily, "kv_cache_total_blocks", "blocks_total", "KV blocks in the pool"),
        (GaugeMetricFamily, "kv_cache_cached_blocks", "blocks_cached", "KV blocks kept by the prefix cache, reusable"),
        (GaugeMetricFamily, "prefix_cache_pinned_blocks", "prefix_pinned_blocks",
         "KV blocks pinned in the prefix cache (cache_retention_seconds, Engine.pin_prefix)"),
        (CounterMetricFamily, "cache_retention_refused", "cache_retention_refused",
         "cache_retention_seconds pins refused (past prefix_pin_share, or nothing of the prefix cached)"),
        (GaugeMetricFamily, "prefix_cache_hit_rate", "prefix_hit_rate",
         "Prompt tokens served from the prefix cache / prompt tokens"),
        (GaugeMetricFamily, "batch_utilization", "recent_batch_utilization",
         "Tokens per step / token budget over the last 256 steps (since the server was last read idle)"),
        (CounterMetricFamily, "prefix_cache_queries", "prompt_tokens_queried",
         "Prompt tokens looked up in the prefix cache"),
        (CounterMetricFamily, "prefix_cache_hits", "prompt_tokens_cached",
         "Prompt tokens served from the prefix cache"),
        (CounterMetricFamily, "num_preemptions", "preemptions", "Requests preempted (blocks taken back) so far"),
        (CounterMetricFamily, "request_added", "requests_added",
         "Requests (choices, echo scorings) added to the engine: added = finished + aborted + failed + those live"),
        (CounterMetricFamily, "request_finished", "requests_finished",
         "Requests (choices, echo scorings) the engine finished (stop or length; request_success: by reason)"),
        (CounterMetricFamily, "request_aborted", "requests_aborted",
         "Requests (choices) aborted: a client that disconnected or cancelled mid-request, a shutdown"),
        (CounterMetricFamily, "request_failed", "requests_failed",
         "Requests (choices) failed on their own input or a processor error"),
        (CounterMetricFamily, "prompt_tokens", "prompt_tokens",
         "Prompt tokens submitted, each of n choices counting its prompt (as vLLM; a response's usage counts it once)"),
        (CounterMetricFamily, "generation_tokens", "generated_tokens", "Tokens generated"),
        (CounterMetricFamily, "num_steps", "steps", "Engine steps (forwards) run"),
        (CounterMetricFamily, "computed_tokens", "computed_tokens",
         "Tokens run through the model (prefill chunks and decodes)"),
        (CounterMetricFamily, "kv_transfer_loaded_blocks", "kv_transfer_loaded_blocks",
         "KV blocks loaded from the disk tier or another engine instead of recomputed"),
        (CounterMetricFamily, "kv_transfer_loaded_tokens", "kv_transfer_loaded_tokens",
         "Prompt tokens whose KV was loaded (disk tier, a peer replica) instead of computed: prefill tokens saved"),
        (CounterMetricFamily, "kv_transfer_load_failures", "kv_transfer_load_failures",
         "KV loads that fell short of what the store announced (the rest recomputed)"),
        (CounterMetricFamily, "kv_transfer_rejected_blocks", "kv_transfer_rejected_blocks",
         "Stored KV blocks refused (corrupt, or made for another model or format) and deleted"),
        (CounterMetricFamily, "kv_transfer_saved_blocks", "kv_transfer_saved_blocks",
         "KV blocks written to the disk tier or a store"),
    )

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self):
        stats = self.metrics.snapshot
        for family_class, name, key, doc in self._FAMILIES:
            family = family_class(f"{_PREFIX}{name}", doc, labels=["model_name"])
            family.add_metric([self.metrics.model_name], float(stats.get(key) or 0.0))
            yield family
