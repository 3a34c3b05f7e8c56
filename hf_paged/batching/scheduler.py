"""`Scheduler`: which requests run in the next forward, and how many tokens each. Policy only.

One step, under a token budget (`max_num_batched_tokens`) and `max_num_seqs`:
  1. running requests, decodes first, then running prefills (chunked: a long prompt takes what budget is left);
     a request that cannot get its blocks preempts the lowest-priority, latest running request (possibly itself;
     one running alone is `stuck` instead, and the engine fails it: no one else holds blocks it could wait for);
  2. waiting requests by priority then arrival (preferring long prefix-cache hits, with an FCFS fallback when the
     queue is long), as long as budget, sequence slots and blocks last; a scoring prompt that a whole step holds
     is not split behind others admitted in the step: it waits for the next (`_waits_for_whole_step`).
While some request decodes in the step, prompt tokens (running prefills and admissions together) are also held
to `max_prefill_tokens_per_step`, so a long prompt is spread over several steps instead of stalling the decodes
(with `max_prefill_step_time_ratio`, also to what keeps the step within that many measured decode-only steps, each
chunk priced by its attention over its cached context too: `kv_transfer/step_times.py`).
A decode with speculative drafts (`request.draft_ids`) runs its last token and the drafts as one chunk; the drafts
are trimmed to the budget left and dropped when their blocks are not free (drafts never preempt anyone).
With `scheduling_policy="remaining"` (`decode_lengths.py`), admission also keeps back the blocks the running
requests need until the shortest remaining tail ends, decodes run shortest tail first, victims are the longest.
The block mechanics (tables, sharing, copy-on-write) are the `KVCacheManager`'s; storage work on preemption
(swapping K/V to CPU) is the engine's, through `on_preempt` / `on_resume` callbacks; blocks past a request's local
prefix hit that another engine or the disk tier holds are loaded by the `kv_transfer` connector as it starts.
"""

from __future__ import annotations

import time
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass, field

from hf_paged.batching.decode_lengths import DecodeLengths
from hf_paged.batching.request import Request, RequestStatus
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.pruning import OBSERVATION_WINDOW
from hf_paged.config import PagedConfig
from hf_paged.errors import InvalidConfigError
from hf_paged.kv_transfer import ChunkFit, KVConnector

# Beyond this many waiting requests, admission is strictly FCFS (no prefix-aware reordering), so nothing starves.
_PREFIX_AWARE_QUEUE_LIMIT = 256


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_tokens: int  # tokens computed this step, starting at request.num_computed_tokens (drafts included)
    num_draft_tokens: int = 0  # of which speculative drafts (`request.draft_ids`), after the request's last token


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_batched_tokens: int = 0
    blocked: Request | None = None  # the waiting request admission stopped on (its blocks did not fit)
    stuck: Request | None = None  # the one running request, whose next tokens the whole pool cannot hold
    num_load_tokens: int = 0  # the step budget loads of waiting requests' blocks took (work done with nothing run)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def _queue_key(request: Request) -> tuple[int, int]:
    return (-request.priority, request.arrival_index)


class Scheduler:
    """Admission, budgeting and preemption over a `KVCacheManager`."""

    def __init__(
        self,
        config: PagedConfig,
        kv: KVCacheManager,
        *,
        extra_keys: Callable[[Request], tuple] = lambda request: (),
        on_preempt: Callable[[Request], None] | None = None,
        on_resume: Callable[[Request], bool] | None = None,
        prefix_policy=None,
        kv_transfer: KVConnector | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.extra_keys = extra_keys
        self.on_preempt = on_preempt  # swap mode: copy the request's K/V to CPU before its blocks go
        self.on_resume = on_resume  # swap mode: take blocks and copy the K/V back; False when they do not fit
        self.prefix_policy = prefix_policy  # cache-aware admission (`PrefixPolicy`), None without a prefix cache
        self.kv_transfer = kv_transfer  # loads leading blocks another engine or the disk tier holds (kv_transfer/)
        if config.max_prefill_step_time_ratio is not None and kv_transfer is None:
            raise InvalidConfigError("max_prefill_step_time_ratio needs the engine's step times, which its KV "
                                     "connector measures: pass kv_store= or kv_offload_dir, or drop the ratio")
        # The one owner of request state: every request the engine knows, by id, from `add`/`register` until
        # `forget` (queued, running, forks waiting for their parent, ended but not yet collected). Written only
        # under the engine's lock; other threads read it through `Engine.requests` (a read-only view) or
        # `live_requests` (a copy).
        self.requests: dict[str, Request] = {}
        self.waiting: list[tuple[tuple[int, int], Request]] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        # "remaining": admission, decode order and victims from the remaining decode lengths (decode_lengths.py)
        self.lengths = DecodeLengths(kv) if config.scheduling_policy == "remaining" else None

    # -- requests --------------------------------------------------------------------------------------
    def register(self, request: Request) -> None:
        """Know a request without queueing it (a fork waiting for its parent's first token, a request that failed
        on arrival); it replaces an earlier attempt under the same id."""
        self.requests[request.request_id] = request

    def forget(self, request_id: str) -> Request | None:
        """Drop an ended request (its output was handed out); None when unknown."""
        return self.requests.pop(request_id, None)

    def live_requests(self) -> list[Request]:
        """The requests not yet ended, as a copy: safe to call from any thread without the engine's lock (one
        C-level copy of the dict's values; a request added meanwhile is seen at the next call)."""
        return [r for r in list(self.requests.values()) if not r.ended]

    # -- queues ----------------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Register a request and queue it for admission."""
        self.requests[request.request_id] = request
        insort(self.waiting, (_queue_key(request), request), key=lambda item: item[0])
        if self.kv_transfer is not None and request.num_preemptions == 0:  # its prefix's disk reads start now
            self.kv_transfer.prefetch(request.request_id, self._cache_tokens(request), self.extra_keys(request))

    def run_fork(self, request: Request) -> None:
        """A fork starts running on blocks its parent shared with it (`KVCacheManager.fork`): no admission. It runs
        right after its parent and older siblings, so a step's rows (and its draws from torch's global generator)
        come in stock's order for `num_return_sequences` (each prompt's n rows together)."""
        request.status = RequestStatus.RUNNING
        if request.scheduled_time is None:
            request.scheduled_time = time.perf_counter()
        family = (request.parent_id, request.request_id)
        at = max((i for i, r in enumerate(self.running) if r.request_id in family or r.parent_id == request.parent_id),
                 default=len(self.running) - 1)
        self.running.insert(at + 1, request)

    def remove(self, request: Request) -> None:
        """Take a request out of the queues and give its blocks back (finish, abort, failure)."""
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting = [item for item in self.waiting if item[1] is not request]
        if request.request_id in self.kv:  # its last partial block first, for a prompt that goes on from it
            self.kv.cache_tail(request.request_id, request.all_token_ids[: request.num_computed_tokens],
                               self.extra_keys(request))
            self.kv.free(request.request_id)
        if self.kv_transfer is not None:
            self.kv_transfer.forget(request.request_id)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step --------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        prompt_budget = budget  # prompt tokens left this step: bounded once a decode is in the step
        bounded, reserve = False, 0  # reserve: prompt budget the running prefills leave to admissions
        # Decodes first, then running prefill chunks; within each, higher priority and earlier arrival first.
        order = sorted(self.running, key=self.lengths.order_key if self.lengths is not None
                       else lambda r: (r.num_tokens_to_compute > 1, _queue_key(r)))
        scheduled_ids: set[str] = set()
        for request in order:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            is_prompt = request.num_tokens_to_compute > 1
            chunk = self._fit_chunk(request, prompt_budget - reserve, bounded) if is_prompt else None
            num_tokens = chunk.num_tokens if chunk is not None else min(request.num_tokens_to_compute, budget)
            if num_tokens == 0:
                break  # the prompt budget is spent: the other prefills wait (they come last in `order`)
            num_drafts = 0 if is_prompt else self._fit_drafts(request, budget)
            num_tokens += num_drafts
            if not self._allocate_or_preempt(request, num_tokens, scheduled_ids, out):
                continue
            out.scheduled.append(ScheduledRequest(request, num_tokens, num_drafts))
            scheduled_ids.add(request.request_id)
            budget -= num_tokens
            if not is_prompt and not bounded:
                prompt_budget, bounded = self._prompt_budget(sum(r.num_tokens_to_compute == 1 for r in order)), True
                reserve = self._admission_reserve(prompt_budget)
            prompt_budget = max(0, min(prompt_budget - (chunk.cost if chunk is not None else 0), budget))
        if not out.preempted and out.stuck is None:  # admitting while preempting would thrash
            left = self._admit(out, prompt_budget, bounded)
            budget -= prompt_budget - left
        out.num_batched_tokens = sum(item.num_tokens for item in out.scheduled)  # (block loads not counted)
        if self.kv_transfer is not None:
            self.kv_transfer.step_started(out)  # its cost model times prefill steps
        if out.is_empty and self.is_loading:
            self.kv_transfer.wait(0.005)  # type: ignore[union-attr]  # nothing to run until a read finishes
        return out

    def _prompt_budget(self, num_decodes: int | None = None) -> int:
        """Prompt tokens one step may carry while requests (`num_decodes` of them) decode in it."""
        limit = self.config.max_prefill_tokens_per_step
        if limit is None or not self.config.enable_chunked_prefill:
            return self.config.max_num_batched_tokens
        if self.kv_transfer is not None:  # sized by time too (max_prefill_step_time_ratio): the connector times steps
            limit = self.kv_transfer.prompt_budget(limit, self.config.max_prefill_step_time_ratio, num_decodes)
        return min(limit, self.config.max_num_batched_tokens)

    def _admission_reserve(self, prompt_budget: int) -> int:
        """In a step sized by time, half the prompt budget is left to waiting requests (a handed-over prompt needs its
        blocks written, a fraction of a token each, where a local chunk takes whole tokens): slow local chunks held the
        whole budget, and handed-over prompts waited seconds for their blocks (`benchmarks/disagg_results.md`)."""
        if self.waiting and self.config.max_prefill_step_time_ratio is not None:
            return prompt_budget // 2
        return 0

    def _fit_chunk(self, request: Request, budget: int, bounded: bool) -> ChunkFit:
        """A prompt chunk cut to the step's prompt `budget`: its tokens, and while requests decode in a step sized by
        time, its attention over its context too (`KVConnector.fit_chunk`: a chunk after a long context is shorter)."""
        config, to_compute = self.config, self._to_compute(request)
        if bounded and config.max_prefill_step_time_ratio is not None and config.enable_chunked_prefill:
            return self.kv_transfer.fit_chunk(  # type: ignore[union-attr]  # (a ratio needs the connector)
                to_compute, request.num_computed_tokens, budget,
                config.max_prefill_tokens_per_step, config.max_prefill_step_time_ratio)
        num_tokens = min(to_compute, budget)
        return ChunkFit(num_tokens, num_tokens)

    def _to_compute(self, request: Request) -> int:
        """The tokens a prefill may compute in one go: all it has to, but a recompute after preemption under SnapKV /
        PyramidKV stops at the prompt's end, where the prompt is pruned as it was the first time, before the
        generated tokens are computed again over what it kept (they attended to that)."""
        if self.config.kv_pruning in ("snapkv", "pyramidkv") and request.num_computed_tokens < len(request.prompt_ids):
            return min(request.num_tokens_to_compute, len(request.prompt_ids) - request.num_computed_tokens)
        return request.num_tokens_to_compute

    def _fit_drafts(self, request: Request, budget: int) -> int:
        """How many of a decode's drafted tokens run this step: what the budget leaves beside its last token, and
        none when their blocks are not free without preempting."""
        drafts = request.draft_ids
        if not drafts:
            return 0
        del drafts[max(budget - 1, 0):]
        if drafts and not self.kv.pool.can_allocate(self.kv.blocks_needed(request.request_id, 1 + len(drafts))):
            drafts.clear()
        return len(drafts)

    def _allocate_or_preempt(self, request: Request, num_tokens: int, scheduled_ids: set[str], out) -> bool:
        """Claim the slots of `request`'s next `num_tokens`, preempting others (or itself) for them. A request running
        alone takes no one's blocks: when the pool cannot hold its next tokens it is `out.stuck` (the engine fails it)
        rather than preempting itself: its recompute would end in the same place (under SnapKV / PyramidKV, whose
        recompute stops at the pruned prompt and so was re-admitted at once, for ever: h7 F0)."""
        if self.kv.allocate_slots(request.request_id, num_tokens):
            return True
        if self._runs_alone(request):
            out.stuck = request
            return False
        while True:
            victims = [r for r in self.running if r.request_id not in scheduled_ids]
            victim = min(victims, key=self.lengths.victim_key if self.lengths is not None
                         else lambda r: (r.priority, -r.arrival_index))
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
            if self.kv.allocate_slots(request.request_id, num_tokens):
                return True

    def _runs_alone(self, request: Request) -> bool:
        """No other request holds blocks (running, or waiting with blocks a load wrote) and none is being read: what
        the pool cannot give `request` now it can never give it. Asked only when an allocation failed."""
        return len(self.running) == 1 and not self.is_loading and not any(
            seq.block_ids for rid, seq in self.kv.seqs.items() if rid != request.request_id)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        if self.on_preempt is not None and self.config.preemption_mode == "swap":
            self.on_preempt(request)  # keeps num_computed_tokens; K/V now in request.swapped
        else:
            request.num_computed_tokens = 0
        self.kv.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.add(request)

    def _admit(self, out: SchedulerOutput, budget: int, bounded: bool = False) -> int:
        if not self.waiting:
            return budget  # the common decode-only step: no in-flight digests, no cache peeks
        candidates = [item[1] for item in self.waiting]
        policy = self.prefix_policy
        inflight = None
        if policy is not None:
            inflight = policy.inflight(self.running)
            if 1 < len(candidates) <= _PREFIX_AWARE_QUEUE_LIMIT:
                # Cache-aware: within a priority level, longer cached prefixes first; FCFS beyond the limit.
                hits = {id(r): policy.cached_prefix_len(r) for r in candidates}
                candidates.sort(key=lambda r: (-r.priority, -hits[id(r)], r.arrival_index))
        admitted: list[Request] = []
        horizon, reserve = self.lengths.reserve(self.running) if self.lengths is not None else (None, 0)
        for request in candidates:
            if budget == 0 or len(self.running) + len(admitted) >= self.config.max_num_seqs:
                break
            if inflight is not None and policy.should_wait(request, inflight):
                continue  # its prefix is being computed by another request: wait, then hit the cache
            if self.kv_transfer is not None and request.swapped is None:
                load = self.kv_transfer.load_step(request.request_id, self._cache_tokens(request),
                                                  self.extra_keys(request), budget)
                budget -= load.num_tokens  # its block writes this step, as prompt tokens of the same cost
                out.num_load_tokens += load.num_tokens
                if load.blocked:
                    break  # the rest of its load does not fit beside the running requests: as a request that
                    # does not fit (FCFS), none behind it takes the blocks it waits for
                if load.waiting or budget == 0:
                    continue  # blocks past its prefix hit are read or written (a share a step): the others go
            if not self._start(request):
                out.blocked = request
                break  # FCFS: do not let smaller requests overtake one that does not fit
            if admitted and self._waits_for_whole_step(request, budget):
                self._unstart(request)
                continue  # smaller requests behind it may fill the rest of this step
            if self.lengths is not None:
                horizon = horizon if horizon is not None else self.lengths.horizon([request])
                if not self.lengths.admits(request, horizon, reserve, alone=not self.running and not admitted):
                    self._unstart(request)
                    out.blocked = request
                    break  # its blocks to the horizon do not fit beside the running requests' (FCFS)
            chunk = self._fit_chunk(request, budget, bounded)
            num_tokens = chunk.num_tokens
            if num_tokens < self._to_compute(request) and not self.config.enable_chunked_prefill \
                    or not self.kv.allocate_slots(request.request_id, num_tokens):
                self._unstart(request)
                out.blocked = request
                break
            request.status = RequestStatus.RUNNING
            if request.scheduled_time is None:  # its first step: it queued from arrival until now
                request.scheduled_time = time.perf_counter()
            request.swapped = None  # swapped-in K/V now live in blocks
            admitted.append(request)
            if self.lengths is not None:
                reserve += self.lengths.need(request, horizon)
            if inflight is not None:
                inflight.add(request)
            out.scheduled.append(ScheduledRequest(request, num_tokens))
            budget = max(0, budget - chunk.cost)
        if admitted:
            ids = {id(r) for r in admitted}
            self.waiting = [item for item in self.waiting if id(item[1]) not in ids]
            self.running.extend(admitted)
        return budget

    def _waits_for_whole_step(self, request: Request, budget: int) -> bool:
        """A scoring prompt that a whole step's budget holds, but not what is left of this one, waits for the next
        step instead of being split: its later chunk would attend with an explicit mask over its whole context,
        where one chunk is one causal attention (on the CPU a rolling window's attention costs ~1.4x split in two).
        Asked only once this step admitted another request, so nothing that running requests take every step can
        hold it back for good; it is first in line at the next step."""
        return request.score_start is not None and budget < request.num_tokens_to_compute <= (
            self.config.max_num_batched_tokens)

    def _start(self, request: Request) -> bool:
        """Register the request's block table (prefix hit or swap-in)."""
        if request.swapped is not None:
            return self.on_resume(request) if self.on_resume is not None else False
        tokens = self._cache_tokens(request)
        cached = self.kv.add_sequence(request.request_id, tokens, self.extra_keys(request))
        if self.kv_transfer is not None:  # blocks past the local hit that a store holds: loaded, not recomputed
            cached = self.kv_transfer.load_prefix(request.request_id, tokens, self.extra_keys(request), cached)
        cached += self.kv.take_partial_block(request.request_id, tokens, self.extra_keys(request))  # + a block's start
        request.num_computed_tokens = cached
        if request.num_preemptions == 0:
            request.num_cached_tokens = cached
        return True

    def _cache_tokens(self, request: Request) -> list[int]:
        """The tokens a prefix hit may serve (the last one is always computed)."""
        tokens = request.all_token_ids
        if request.score_start is not None:  # scoring: its first scored position is computed, never served from cache
            tokens = tokens[: request.score_start + 1]
        if self.config.kv_pruning in ("snapkv", "pyramidkv"):
            # SnapKV / PyramidKV rank the prompt's blocks by the attention of its last OBSERVATION_WINDOW queries,
            # so those are always computed: a hit that served some would leave their votes out and the selection
            # (and the output) would depend on what the cache held (the h5 pass)
            tokens = tokens[: max(len(request.prompt_ids) - OBSERVATION_WINDOW, 0) + 1]
        return tokens

    @property
    def is_loading(self) -> bool:
        """Whether blocks are being read for a waiting request: a step with nothing to run is then a wait."""
        return self.kv_transfer is not None and self.kv_transfer.num_fetching > 0

    def _unstart(self, request: Request) -> None:
        if request.swapped is None:
            request.num_computed_tokens = 0
        self.kv.free(request.request_id)
