"""Admission: the server's bound on waiting sequences (`--max-waiting`). A request is admitted (or answered 400 /
429 / 503) before its prompts enter the engine loop's queue; between the two its sequences count as admitted, so
concurrent arrivals cannot all slip under the bound. Used on the event loop thread only."""

from __future__ import annotations

from hf_paged.batching.engine_loop import EngineLoop
from hf_paged.serving.errors import ApiError

DEFAULT_WAITING_BATCHES = 64  # the default bound: this many full batches (max_num_seqs) of sequences waiting
# Big bodies (past body.OFF_LOOP_BYTES) decoded at once; the rest wait their turn, already read. Decoding and
# validating one costs ~9x its size in memory (a 31 MB list of ids: 270 MB) and ~1 s of CPU: with anyio's 40 worker
# threads, 40 at once would take ~10 GB and every core while streams and the engine wait.
MAX_BIG_BODIES_DECODING = 2


def waiting_bound(max_waiting: int | None, max_num_seqs: int) -> int | None:
    """The queue bound in sequences: `max_waiting` as given, its default (64 full batches: 8,192 sequences with the
    default `max_num_seqs` of 128, so memory and queueing delay stay bounded by default and still scale with the
    engine), or None (no bound) for 0."""
    if max_waiting is None:
        return DEFAULT_WAITING_BATCHES * max_num_seqs
    return max_waiting or None


class AdmissionGate:
    def __init__(self, loop: EngineLoop, max_waiting: int | None, retry_after_s: int) -> None:
        self.loop = loop
        self.max_waiting = max_waiting  # None: no bound
        self.retry_after_s = retry_after_s
        self.num_admitted = 0  # sequences admitted whose requests are not in the loop's queue yet

    def check_size(self, num_prompts: int, n: int = 1, scoring: int = 0) -> None:
        """400 for a request of more sequences than the queue may ever hold; also called before a request's prompts
        are tokenized (100,000 one-character prompts took 7.6 s of tokenizing before this answer)."""
        limit = self.max_waiting
        total = num_prompts * n + scoring
        if limit is not None and total > limit:
            scored = f" + {scoring} prompts' scoring (echo with logprobs)" if scoring else ""
            raise ApiError(f"this request asks for {total} sequences ({num_prompts} prompts x n={n}{scored}) but "
                           f"the server queues at most {limit} (--max-waiting): split it into smaller requests",
                           param="n" if n > 1 else "prompt", code="request_too_large")

    def admit(self, num_prompts: int, n: int = 1, scoring: int = 0) -> Admission:
        """Admit a request's prompts or answer 400 (more sequences, prompts x `n` plus its `scoring` requests (echo's
        prompt log-probabilities), than the queue may ever hold), 429 (queue full) / 503 (shutting down)."""
        limit = self.max_waiting
        total = num_prompts * n + scoring
        self.check_size(num_prompts, n, scoring)
        if limit is not None and self.loop.num_waiting + self.num_admitted + total > limit:
            raise ApiError(f"the server's queue is full ({limit} sequences waiting); retry after "
                           f"{self.retry_after_s} s", status=429, code="rate_limit_exceeded",
                           headers={"Retry-After": str(self.retry_after_s)})
        if not self.loop.is_alive:
            raise ApiError("the server is shutting down; retry on another replica", status=503,
                           code="shutting_down")
        self.num_admitted += total
        return Admission(self, total, n)


class Admission:
    """One request's admitted sequences (prompts x `n`, plus scoring requests) not yet queued in the loop; `queued`
    as each prompt is (its `n` sequences then count in the loop's `num_waiting`), `scoring_queued` as each scoring
    request is, `close` at the end."""

    def __init__(self, gate: AdmissionGate, num_sequences: int, n: int) -> None:
        self._gate = gate
        self._left = num_sequences
        self._n = n

    def queued(self, count: int | None = None) -> None:
        step = min(self._n if count is None else count, self._left)
        self._left -= step
        self._gate.num_admitted -= step

    def scoring_queued(self) -> None:
        self.queued(1)

    def close(self) -> None:
        """The response is over (or never started): sequences never queued stop counting as waiting."""
        self._gate.num_admitted -= self._left
        self._left = 0
