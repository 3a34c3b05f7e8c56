"""`engine_stats`: the flat dictionary `Engine.stats()` returns, gathered from the engine's parts."""

from __future__ import annotations

from hf_paged.batching.kv_pruning import KVPruner
from hf_paged.batching.lifecycle import RequestLifecycle
from hf_paged.batching.metrics import EngineMetrics
from hf_paged.batching.model_runner import ModelRunner
from hf_paged.batching.sampler import Sampler
from hf_paged.batching.scheduler import Scheduler
from hf_paged.cache.paged_cache import PagedCache

__all__ = ["engine_stats"]


def engine_stats(*, metrics: EngineMetrics, max_num_batched_tokens: int, cache: PagedCache, scheduler: Scheduler,
                 pruner: KVPruner, sampler: Sampler, lifecycle: RequestLifecycle, runner: ModelRunner) -> dict:
    """Metrics (tokens, latencies, speculation), cache gauges, scheduler queues, constraint work and retries."""
    stats = metrics.summary(max_num_batched_tokens)
    stats.update(cache.stats())
    stats["preemptions"] = scheduler.num_preemptions
    stats["prefix_evictions"] = cache.pool.num_evictions
    stats["kv_blocks_evicted"] = pruner.num_dropped_blocks
    stats["kv_usage"] = stats["blocks_used"] / stats["blocks_total"]
    stats["requests_running"] = len(scheduler.running)
    stats["requests_waiting"] = len(scheduler.waiting) + lifecycle.num_waiting_forks  # as `Engine.num_waiting`
    stats["requests_swapped"] = sum(r.swapped is not None for _, r in scheduler.waiting)  # of those, KV in CPU memory
    stats.update(sampler.constraint_stats.summary())
    stats["retries"] = lifecycle.retrier.num_retries
    stats["retried_requests"] = lifecycle.retrier.num_retried_requests
    if scheduler.kv_transfer is not None:  # blocks loaded from / saved to another engine or the disk tier
        stats.update(scheduler.kv_transfer.stats())
    graphs = runner.graphs  # decode steps replayed from CUDA graphs, and the buckets captured (0 off CUDA)
    stats["decode_graph_replays"] = graphs.replays if graphs is not None else 0
    stats["decode_graphs_captured"] = graphs.num_captured if graphs is not None else 0
    head = runner.certified.stats if runner.certified is not None else None  # greedy rows of the certified head
    stats["certified_head_rows"] = head.rows if head is not None else 0
    stats["certified_head_open_rows"] = head.open_rows if head is not None else 0  # settled by exact values
    return stats
