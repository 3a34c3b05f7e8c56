"""`engine_stats`: the flat dictionary `Engine.stats()` returns, gathered from the engine's parts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.batching.engine import Engine

__all__ = ["engine_stats"]


def engine_stats(engine: Engine) -> dict:
    """Metrics (tokens, latencies, speculation), cache gauges, scheduler queues, constraint work and retries."""
    stats = engine.metrics.summary(engine.config.max_num_batched_tokens)
    stats.update(engine.cache.stats())
    stats["preemptions"] = engine.scheduler.num_preemptions
    stats["prefix_evictions"] = engine.cache.pool.num_evictions
    stats["kv_blocks_evicted"] = engine.pruner.num_dropped_blocks
    stats["kv_usage"] = stats["blocks_used"] / stats["blocks_total"]
    stats["requests_running"] = len(engine.scheduler.running)
    stats["requests_waiting"] = len(engine.scheduler.waiting)
    stats.update(engine.sampler.constraint_stats.summary())
    stats["retries"] = engine.lifecycle.retrier.num_retries
    stats["retried_requests"] = engine.lifecycle.retrier.num_retried_requests
    return stats
