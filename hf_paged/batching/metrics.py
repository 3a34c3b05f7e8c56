"""Engine metrics: counters and latency samples, summarised by `Engine.stats()`."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Latency samples kept for percentiles: the most recent ones (a long-running server must not grow without bound).
MAX_LATENCY_SAMPLES = 10_000


def percentile(values, q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no samples."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


@dataclass(slots=True)
class EngineMetrics:
    num_requests_added: int = 0  # requests and their forks (n) added; each ends finished, failed or aborted
    num_requests_finished: int = 0
    num_requests_failed: int = 0
    num_requests_aborted: int = 0
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission; scoring: + its last target)
    num_prompt_tokens_cached: int = 0  # of which served by the prefix cache
    num_prompt_tokens_queried: int = 0  # prompt tokens of ended requests that ran (each once, forks not counted)
    num_computed_tokens: int = 0  # tokens run through the model (prefill chunks, recompute, decodes)
    num_generated_tokens: int = 0
    num_forced_tokens: int = 0  # tokens appended by jump-forward (decode steps saved)
    num_draft_tokens: int = 0  # speculative decoding: drafted tokens verified by the model
    num_accepted_tokens: int = 0  # of which accepted (decode steps saved)
    num_steps: int = 0
    peak_blocks_used: int = 0  # most blocks in use after any step's scheduling
    recent_step_tokens: deque[int] = field(default_factory=lambda: deque(maxlen=256))  # tokens of the last steps
    # seconds, per request, the most recent MAX_LATENCY_SAMPLES
    time_to_first_token: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_LATENCY_SAMPLES))
    # seconds, per request (mean after its first token), the most recent MAX_LATENCY_SAMPLES
    time_per_output_token: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_LATENCY_SAMPLES))

    def summary(self, max_num_batched_tokens: int) -> dict:
        steps = max(self.num_steps, 1)
        return {
            "requests_added": self.num_requests_added,
            "requests_finished": self.num_requests_finished,
            "requests_failed": self.num_requests_failed,
            "requests_aborted": self.num_requests_aborted,
            "prompt_tokens": self.num_prompt_tokens,
            "prompt_tokens_cached": self.num_prompt_tokens_cached,
            # served / looked up, both counted as a request ends (forks once, with their parent): the same ratio as
            # /metrics' prefix_cache_hit_rate (prompt_tokens counts every fork and the requests still live)
            "prefix_hit_rate": self.num_prompt_tokens_cached / self.num_prompt_tokens_queried
            if self.num_prompt_tokens_queried else 0.0,
            "computed_tokens": self.num_computed_tokens,
            "generated_tokens": self.num_generated_tokens,
            "forced_tokens": self.num_forced_tokens,
            "draft_tokens": self.num_draft_tokens,
            "accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None,
            "steps": self.num_steps,
            "peak_blocks_used": self.peak_blocks_used,
            "tokens_per_step": self.num_computed_tokens / steps,
            "batch_utilization": self.num_computed_tokens / (steps * max_num_batched_tokens),
            # over the last steps (at most 256): what a server's health check reads
            "recent_batch_utilization": sum(self.recent_step_tokens) / (len(self.recent_step_tokens) * max_num_batched_tokens)
            if self.recent_step_tokens else None,
            "prompt_tokens_queried": self.num_prompt_tokens_queried,
            "ttft_p50_s": percentile(self.time_to_first_token, 50),
            "ttft_p99_s": percentile(self.time_to_first_token, 99),
            "tpot_p50_s": percentile(self.time_per_output_token, 50),
            "tpot_p99_s": percentile(self.time_per_output_token, 99),
        }
