"""`RequestLifecycle`: how a request ends, and the requests that come of it (forks, retries).

    add      parent (scheduled) + forks (num_return_sequences; wait here, not in the scheduler)
    first sampled token of the parent -> its forks take its blocks (shared, copy-on-write) and run
    end      FINISHED | FAILED -> max_retries? Retrier decides: the next attempt is queued under the same id, or
             the request is done: constraints and drafters forget it, metrics count it, its output waits in `ended`
             until the step (or `Engine.take_ended`) hands it out

A request's blocks go back to the pool when the scheduler removes it (before `end`); a refused attempt's prompt
blocks stay in the prefix cache for the next one.
"""

from __future__ import annotations

import logging
import time

from hf_paged.batching.metrics import EngineMetrics
from hf_paged.batching.request import Failure, Request, RequestOutput, RequestStatus, fork_ids
from hf_paged.batching.retry import Retrier, num_generated_tokens, retry_seed
from hf_paged.batching.scheduler import Scheduler
from hf_paged.batching.speculative import Speculator
from hf_paged.batching.stopping import stop_boundary
from hf_paged.cache.kv_manager import KVCacheManager

__all__ = ["RequestLifecycle"]

logger = logging.getLogger("hf_paged")


class RequestLifecycle:
    """Ends requests (finish, fail, abort, retry) and starts their forks; owns the outputs not yet handed out.

    Args:
        scheduler: the engine's, the owner of its requests (retries go in under their id, forks under theirs).
        kv, speculator, metrics: the engine's.
    """

    def __init__(self, scheduler: Scheduler, kv: KVCacheManager, speculator: Speculator,
                 metrics: EngineMetrics) -> None:
        self.scheduler = scheduler
        self.kv = kv
        self.speculator = speculator
        self.metrics = metrics
        self.retrier = Retrier()  # max_retries: reruns of refused attempts (retry.py)
        self.children: dict[str, list[Request]] = {}  # parent id -> forks waiting for the parent's first token
        self.ended: list[RequestOutput] = []  # outputs not yet handed out

    # -- forks ---------------------------------------------------------------------------------------------
    def add_forks(self, parent: Request) -> None:
        """Make the forks of a new request (`num_return_sequences - 1`); they wait for its first token. Every new
        request passes here (also one refused at once): the request and its forks count as added."""
        params = parent.params
        self.metrics.num_requests_added += params.num_return_sequences
        for k, child_id in enumerate(fork_ids(parent.request_id, params.num_return_sequences)[1:]):
            child = Request(child_id, parent.prompt_ids, params, parent.priority, parent.arrival_index)
            child.arrival_time = parent.arrival_time
            child.parent_id, child.fork_index = parent.request_id, k + 1
            if params.seed is not None:
                # a digest, not seed + k + 1 (fork 1 of seed 200 drew request seed 201's tokens); its generator
                child.seed = retry_seed(params.seed, k + 1, 0)  # is made at its first draw (`generator_on`)
            self.scheduler.register(child)
            self.children.setdefault(parent.request_id, []).append(child)

    @property
    def num_waiting_forks(self) -> int:
        """Forks made but not running yet: they wait for their parent's first token. Any thread may read it (the
        values are copied in one C-level call, so the step thread's changes cannot break the iteration)."""
        return sum(len(forks) for forks in list(self.children.values()))

    def fork_children(self, parent: Request) -> list[Request]:
        """At the parent's first sampled token, its forks take its blocks (shared, copy-on-write) and run."""
        children = self.children.pop(parent.request_id, [])
        for child in children:
            self.kv.fork(parent.request_id, child.request_id)
            child.num_computed_tokens = parent.num_computed_tokens
            self.scheduler.run_fork(child)
        return children

    # -- ending --------------------------------------------------------------------------------------------
    def finish(self, request: Request, reason: str) -> None:
        """Take a request out of the schedule and end it FINISHED with `reason` ("stop", "length")."""
        self.scheduler.remove(request)
        self.end(request, RequestStatus.FINISHED, reason, None)

    def fail(self, request: Request, failure: Failure) -> None:
        """Take a request out of the schedule and end it FAILED (its blocks go back to the pool)."""
        self.scheduler.remove(request)
        self.end(request, RequestStatus.FAILED, "error", failure)

    def abort(self, request: Request, failure: Failure | None) -> None:
        """End a request (and its waiting forks) now: FAILED with `failure`, or aborted by the caller."""
        if failure is None:
            reason, failure = "abort", Failure("aborted by the caller")
        else:
            reason = "error"
        for child in self.children.pop(request.request_id, []):
            self.end(child, RequestStatus.FAILED, reason, failure)
        siblings = self.children.get(request.parent_id or "", [])
        if request in siblings:  # a fork still waiting for its parent: it must not run (nor end) at that token
            siblings.remove(request)
        self.scheduler.remove(request)
        self.end(request, RequestStatus.FAILED, reason, failure)

    def abort_with_forks(self, request: Request, failure: Failure | None) -> None:
        """`abort` for a request and each of its `n` forks still live, those already running on their own included
        (a fork: itself alone)."""
        n = request.params.num_return_sequences if request.parent_id is None else 1
        for live in [self.scheduler.requests.get(rid) for rid in fork_ids(request.request_id, n)]:
            if live is not None and not live.ended:
                self.abort(live, failure)

    def end(self, request: Request, status: RequestStatus, reason: str, failure: Failure | None) -> None:
        """Record the end of a request already out of the schedule (or, with max_retries, queue its next
        attempt)."""
        if reason == "length" and any(not c.is_complete(request.request_id, request.output_ids)
                                      for c in request.processors.constraints):
            reason = "length_incomplete"  # max_new_tokens cut a constrained document short: it will not parse
        elif reason == "stop" and any(c.error(request.request_id) is not None for c in request.processors.constraints):
            reason = "stop_incomplete"  # EOS ended a document its constraint had given up on: it will not parse
        elif reason == "stop" and _cut_by_stop_string(request):
            reason = "stop_incomplete"  # a stop string cut the document short: the text before it will not parse
        if request.params.max_retries:
            decision = self.retrier.end_attempt(request, status, reason)
            if decision.retry is not None:
                self._retry(request, decision.retry)
                return
            if decision.error is not None:
                status, reason, failure = RequestStatus.FAILED, "error", decision.error
        request.status, request.finish_reason = status, reason
        if failure is not None:
            request.error, request.error_type = failure.message, failure.error_type
        request.finish_time = time.perf_counter()
        request.swapped = None
        self._forget(request)
        for child in self.children.pop(request.request_id, []):  # forks of a parent that never sampled
            self.end(child, status, reason, failure)
        if status is RequestStatus.FINISHED:
            self.metrics.num_requests_finished += 1
            num_tokens = num_generated_tokens(request)  # every attempt's: the span runs from the first one's
            if request.first_token_time is not None and num_tokens > 1:
                span = request.last_token_time - request.first_token_time
                self.metrics.time_per_output_token.append(span / (num_tokens - 1))
        elif reason == "abort":  # counted here, once per request: forks that never ran end here too
            self.metrics.num_requests_aborted += 1
        else:
            self.metrics.num_requests_failed += 1
        if request.parent_id is None:
            self.metrics.num_prompt_tokens_cached += request.num_cached_tokens
            if request.num_computed_tokens or request.output_ids:  # it ran (was admitted at least once)
                self.metrics.num_prompt_tokens_queried += len(request.prompt_ids)
        self.ended.append(request.to_output())

    def take_ended(self) -> list[RequestOutput]:
        """The outputs of the requests ended since the last call, handed out once."""
        ended, self.ended = self.ended, []
        return ended

    def _retry(self, request: Request, retry: Request) -> None:
        """Queue the next attempt of a refused request under the same id (its blocks are already freed; the
        prompt's full blocks stay in the prefix cache). The old attempt is marked done ("retry") and never output."""
        self._forget(request)
        request.status, request.finish_reason = RequestStatus.FINISHED, "retry"
        if request.parent_id is None:
            self.metrics.num_prompt_tokens_cached += request.num_cached_tokens
            self.metrics.num_prompt_tokens_queried += len(request.prompt_ids)
        self.metrics.num_prompt_tokens += len(retry.prompt_ids)
        self.scheduler.add(retry)

    def _forget(self, request: Request) -> None:
        """The request's constraints and drafters drop its state."""
        for constraint in request.processors.constraints:
            try:
                constraint.release(request.request_id)
            except Exception:  # noqa: BLE001 -- a user's constraint: the request still ends (an end that raised
                # left it running for ever: h9), at worst its state stays with the constraint
                logger.exception("hf_paged: %r failed to release request %s", constraint, request.request_id)
        self.speculator.release(request.request_id)


def _cut_by_stop_string(request: Request) -> bool:
    """Whether a stop string ended a constrained request inside its document: the tokens that spell the text before
    the stop string leave a constraint incomplete, or that text ends inside a token (found by a hostile pass: a
    choice cut to "a" by `stop=["b"]` ended "stop", and a program called it valid)."""
    constraints = request.processors.constraints
    if not constraints or not request.params.stop_strings or request.output_ids[-1] in request.params.eos_token_ids:
        return False
    k = stop_boundary(request)
    return k is None or any(not c.is_complete(request.request_id, request.output_ids[:k]) for c in constraints)
