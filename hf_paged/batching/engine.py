"""`Engine`: the step loop of continuous batching over the paged cache.

One `step()`: (speculative drafts) -> schedule -> one packed forward -> sample the rows that need a token (verify
the drafts, roll back the rejected ones) -> stop checks -> hand finished requests' blocks to the prefix cache.
Requests may be added and aborted between steps. A request's bad input, failing processor or abort ends that
request only; the pool returns to its state before it.

Thread safety: `add_request`, `abort`, `step` and `pop_output` hold the engine's lock, so callers in several
threads never see a half-done step. One background thread drives the engine for concurrent callers
(`Engine.loop`, `engine_loop.py`); step listeners see every step, whichever thread ran it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from hf_paged.batching.kv_eviction import KVEvictor
from hf_paged.batching.metrics import EngineMetrics
from hf_paged.batching.model_runner import ModelRunner
from hf_paged.batching.prefix_policy import PrefixPolicy
from hf_paged.batching.request import Request, RequestOutput, RequestStatus, StepOutput, fork_ids
from hf_paged.batching.retry import Retrier
from hf_paged.batching.sampler import Sampler
from hf_paged.batching.sampling import SamplingParams
from hf_paged.batching.scheduler import Scheduler, SchedulerOutput
from hf_paged.batching.speculative import DraftRows, Speculator
from hf_paged.batching.step_inputs import build_step_inputs
from hf_paged.batching.stopping import check_stop
from hf_paged.batching.swap import swap_in, swap_out
from hf_paged.batching.weights import weights_fingerprint
from hf_paged.cache.kernels.cpu_launch import warm_up as warm_up_cpu_kernels
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.sizing import kv_shape_of
from hf_paged.config import PagedConfig
from hf_paged.errors import HfPagedError, InvalidPromptError, PromptTooLongError


class Engine:
    """Continuous batching over a stock transformers causal LM.

    Example:
        >>> engine = Engine(model, PagedConfig(max_num_batched_tokens=256))          # doctest: +SKIP
        >>> rid = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=8))     # doctest: +SKIP
        >>> while engine.has_unfinished: engine.step()                                # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, config: PagedConfig | None = None) -> None:
        self.model = model
        self.config = config or PagedConfig()
        param = next(model.parameters())
        self.cache = PagedCache(
            model.config, self.config, dtype=param.dtype, device=param.device,
            prefix_cache=self.config.enable_prefix_caching,
        )
        self.kv = self.cache.manager
        self.scheduler = Scheduler(
            self.config, self.kv, extra_keys=self._extra_keys,
            on_preempt=lambda r: swap_out(self.cache, r), on_resume=lambda r: swap_in(self.cache, r),
            prefix_policy=PrefixPolicy(self.kv.prefix_cache, self.config.block_size, self._extra_keys)
            if self.kv.prefix_cache is not None else None,
        )
        self.runner = ModelRunner(model, self.cache)
        self.evictor = KVEvictor(self.config, self.kv, self.cache.kv_shape.num_layers)
        self.sampler = Sampler()
        self.retrier = Retrier()  # max_retries: reruns of refused attempts (retry.py)
        self.metrics = EngineMetrics()
        self.requests: dict[str, Request] = {}
        self._children: dict[str, list[Request]] = {}  # parent id -> forks waiting for the parent's prompt
        self._ended: list[RequestOutput] = []  # outputs not yet handed out by step()
        self._arrivals = itertools.count()
        self._ids = itertools.count()
        self._reserved_ids: set[str] = set()  # ids handed out by `reserve_request_id`, not yet added
        self._ids_lock = threading.Lock()  # guards ids only (never held during a step)
        self._lock = threading.RLock()  # held by every call that changes requests or the pool
        self._step_listeners: list[Callable[[StepOutput], None]] = []
        self._loop = None  # the EngineLoop, created by `loop` at first use
        text_config = model.config.get_text_config(decoder=True)
        self.vocab_size = int(text_config.vocab_size)
        self.max_model_len = kv_shape_of(model.config).max_model_len
        self._weights = weights_fingerprint(model)
        self.speculator = Speculator(
            self.kv, self.config, num_blocks=self.cache.num_blocks, vocab_size=self.vocab_size,
            max_model_len=self.max_model_len, unsupported=self._speculation_unsupported(),
        )
        if self.config.attention_backend == "auto" and param.device.type == "cpu" and param.dtype == torch.float32:
            warm_up_cpu_kernels()  # the in-place attention kernels: compiled once per install, loaded once here

    # -- requests ----------------------------------------------------------------------------------------
    def add_request(
        self, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams | None = None, *,
        request_id: str | None = None, priority: int = 0,
    ) -> str:
        """Queue a prompt; returns its id (unique in this engine when not given). Bad input does not raise: the
        request ends FAILED with `error`. A `request_id` already in use raises `ValueError`."""
        params = params or SamplingParams()
        return self.add_reserved_request(self.reserve_request_id(request_id), prompt_ids, params, priority)

    def reserve_request_id(self, request_id: str | None = None) -> str:
        """Claim a request id before `add_request` (a new unique one when None); thread-safe, never waits for a
        step. Raises `ValueError` when the given id is in use or already claimed."""
        with self._ids_lock:
            if request_id is None:
                request_id = f"req_{next(self._ids)}"
                while request_id in self.requests or request_id in self._reserved_ids:
                    request_id = f"req_{next(self._ids)}"
            elif request_id in self.requests or request_id in self._reserved_ids:
                raise ValueError(f"request id {request_id!r} is already in use; pass a unique request_id (or none)")
            self._reserved_ids.add(request_id)
            return request_id

    def release_request_ids(self, request_ids: Iterable[str]) -> None:
        """Give back ids claimed with `reserve_request_id` that will not be added."""
        with self._ids_lock:
            self._reserved_ids.difference_update(request_ids)

    def add_reserved_request(
        self, request_id: str, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams | None = None,
        priority: int = 0, *, arrival_time: float | None = None,
    ) -> str:
        """`add_request` under an id claimed earlier with `reserve_request_id`. `arrival_time`: when the caller
        submitted it (`time.perf_counter()`), so TTFT counts the wait before it reached the engine."""
        params = params or SamplingParams()
        with self._lock:
            with self._ids_lock:
                if request_id not in self._reserved_ids:
                    raise ValueError(f"request id {request_id!r} was not reserved; use add_request")
                self._reserved_ids.discard(request_id)
            return self._add(request_id, prompt_ids, params, priority, arrival_time)

    def _add(self, request_id: str, prompt_ids, params: SamplingParams, priority: int,
             arrival_time: float | None = None) -> str:
        if isinstance(prompt_ids, torch.Tensor):
            prompt_ids = prompt_ids.reshape(-1).tolist()
        request = Request(request_id, [int(t) for t in prompt_ids], params, priority, next(self._arrivals))
        if arrival_time is not None:
            request.arrival_time = arrival_time
        if params.seed is not None:
            request.generator = torch.Generator().manual_seed(params.seed)
        self.requests[request_id] = request
        error = self.validate_prompt(request.prompt_ids, params)
        error = str(error) if error is not None else self.speculator.check(params)
        if error is not None:
            self._end(request, RequestStatus.FAILED, "error", error)
            return request_id
        for k, child_id in enumerate(fork_ids(request_id, params.num_return_sequences)[1:]):
            child = Request(child_id, request.prompt_ids, params, priority, request.arrival_index)
            child.arrival_time = request.arrival_time
            child.parent_id = request_id
            if params.seed is not None:
                child.generator = torch.Generator().manual_seed(params.seed + k + 1)
            self.requests[child.request_id] = child
            self._children.setdefault(request_id, []).append(child)
        for proc in params.logits_processors:
            if hasattr(proc, "prepare"):
                proc.prepare()  # constrained processors compile in the background while the prompt prefills
        self.metrics.num_prompt_tokens += len(request.prompt_ids) * params.num_return_sequences
        self.scheduler.add(request)
        return request_id

    def validate_prompt(self, prompt_ids: Sequence[int], params: SamplingParams) -> HfPagedError | None:
        """Why a prompt cannot run, as the error to raise (`InvalidPromptError`, `PromptTooLongError`), or None."""
        if len(prompt_ids) == 0:
            return InvalidPromptError("empty prompt: give at least one token id")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            return InvalidPromptError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_model_len:
            return PromptTooLongError(
                f"prompt of {len(prompt_ids)} tokens leaves no room to generate within the model's maximum of "
                f"{self.max_model_len} positions: shorten it"
            )
        need = -(-(len(prompt_ids) + 1) // self.config.block_size)
        if need > self.cache.num_blocks:
            return PromptTooLongError(
                f"prompt of {len(prompt_ids)} tokens needs {need} blocks but the pool has {self.cache.num_blocks}: "
                "raise PagedConfig.num_blocks (or max_cache_bytes)"
            )
        return None

    def abort(self, request_id: str, *, error: str | None = None) -> None:
        """End a request now; its blocks go back to the pool at once. With `error`, it ends FAILED with that error
        (finish reason "error") instead of as aborted by the caller."""
        with self._lock:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                return
            reason, message = ("error", error) if error is not None else ("abort", "aborted by the caller")
            for child in self._children.pop(request_id, []):
                self._end(child, RequestStatus.FAILED, reason, message)
            self.scheduler.remove(request)
            if error is None:
                self.metrics.num_requests_aborted += 1
            self._end(request, RequestStatus.FAILED, reason, message)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def pop_output(self, request_id: str) -> RequestOutput:
        """The output of an ended request, forgetting it."""
        with self._lock:
            return self.requests.pop(request_id).to_output()

    @property
    def loop(self):
        """The `EngineLoop` that drives this engine from one background thread for any number of callers
        (threads or asyncio tasks); created at first use, its thread started at the first submission."""
        if self._loop is None:
            from hf_paged.batching.engine_loop import EngineLoop

            with self._ids_lock:
                if self._loop is None:
                    self._loop = EngineLoop(self)
        return self._loop

    def take_ended(self) -> list[RequestOutput]:
        """Outputs of requests ended since the last step (aborts between steps), handed out once."""
        with self._lock:
            ended, self._ended = self._ended, []
            return ended

    def add_step_listener(self, listener: Callable[[StepOutput], None]) -> None:
        """Call `listener(step_output)` after every step, in the stepping thread, under the engine's lock: it must
        be quick and must not call back into the engine."""
        self._step_listeners.append(listener)

    # -- the step loop -----------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        with self._lock:
            if self.scheduler.waiting:  # the prefix cache is only read when requests are admitted: check there
                self._check_weights()
            result = StepOutput()
            for failure in self.speculator.propose(self.scheduler.running):
                self.scheduler.remove(failure.request)
                self._end(failure.request, RequestStatus.FAILED, "error", failure.error)
            schedule = self.scheduler.schedule()
            if schedule.is_empty:
                self._fail_unschedulable()
            else:
                self._run(schedule, result)
            result.finished, self._ended = self._ended, []
            for listener in self._step_listeners:
                listener(result)
            return result

    def _run(self, schedule: SchedulerOutput, result: StepOutput) -> None:
        self.metrics.peak_blocks_used = max(self.metrics.peak_blocks_used, self.cache.pool.num_used_blocks)
        inputs = build_step_inputs(schedule, self.kv, self.config.block_size, self.config.attention_backend,
                                   self.evictor.observation_window)
        self.evictor.annotate(schedule, inputs.metadata)
        try:
            logits = self.runner.forward(inputs.input_ids, inputs.positions, inputs.metadata, inputs.logits_rows)
        except Exception as exc:  # noqa: BLE001 -- the forward failed: its requests fail, the engine goes on
            for item in schedule.scheduled:
                self.scheduler.remove(item.request)
                self._end(item.request, RequestStatus.FAILED, "error", f"forward failed: {type(exc).__name__}: {exc}")
            return
        self.metrics.num_steps += 1
        self.metrics.num_computed_tokens += len(inputs.input_ids)
        self.metrics.recent_step_tokens.append(len(inputs.input_ids))
        for item in schedule.scheduled:
            item.request.num_computed_tokens += item.num_tokens
        self.evictor.after_forward(schedule, inputs.metadata)  # KV eviction drops blocks before they can be shared
        for item in schedule.scheduled:
            request = item.request
            tokens = self.evictor.cacheable_tokens(request, request.all_token_ids[: request.num_computed_tokens])
            self.kv.cache_full_blocks(request.request_id, tokens, self._extra_keys(request))
        sampled, drafted = inputs.sampled_requests, None
        if any(inputs.num_draft_tokens):  # speculating decodes have 1 + k rows each: verified apart
            split = self.speculator.split(inputs, logits)
            sampled, logits, drafted = split.requests, split.logits, split.drafted
        samplers, row_of = list(sampled), list(range(len(sampled)))
        for row, parent in enumerate(sampled):
            children = self._fork_children(parent)  # forks sample their first token from the parent's row
            samplers.extend(children)
            row_of.extend([row] * len(children))
        if len(samplers) != len(sampled):
            logits = logits.index_select(0, torch.tensor(row_of))
        if drafted is not None:
            self._verify(drafted, result)
        if not samplers:
            return
        with torch.inference_mode():  # the logits are inference tensors: processors may edit them in place
            sample = self.sampler(samplers, logits)
        now = time.perf_counter()
        for request, token, error in zip(samplers, sample.token_ids, sample.errors):
            if error is not None:
                self.scheduler.remove(request)
                self._end(request, RequestStatus.FAILED, "error", error)
                continue
            self._append(request, [token], now, result)
            if not request.is_finished and not request.params.output_scores:
                self._jump_forward(request, now, result)

    def _verify(self, drafted: DraftRows, result: StepOutput) -> None:
        """Keep each speculating request's accepted drafts and the model's next token; roll back the rest."""
        with torch.inference_mode():
            verdicts = self.speculator.verify(drafted, self.sampler)
        now = time.perf_counter()
        for request, verdict in zip(drafted.requests, verdicts):
            if verdict.error is not None:
                self.scheduler.remove(request)
                self._end(request, RequestStatus.FAILED, "error", verdict.error)
                continue
            self.speculator.settle(request, verdict)
            self.metrics.num_draft_tokens += verdict.num_drafted
            self.metrics.num_accepted_tokens += verdict.num_accepted
            self._append(request, verdict.token_ids, now, result)
            if not request.is_finished and not request.params.output_scores:
                self._jump_forward(request, now, result)

    def _append(self, request: Request, tokens: list[int], now: float, result: StepOutput) -> None:
        streams = not request.params.max_retries  # a request that may rerun shows its tokens once it has ended
        for token in tokens:
            request.output_ids.append(token)
            if streams:
                result.new_tokens.setdefault(request.request_id, []).append(token)
            self.metrics.num_generated_tokens += 1
            if request.first_token_time is None:
                request.first_token_time = now
                self.metrics.time_to_first_token.append(now - request.arrival_time)
            request.last_token_time = now
            reason = check_stop(request, self.max_model_len)
            if reason is not None:
                self.scheduler.remove(request)
                self._end(request, RequestStatus.FINISHED, reason, None)
                if not streams and request.finish_reason != "retry":
                    result.new_tokens[request.request_id] = list(request.output_ids)
                return

    def _jump_forward(self, request: Request, now: float, result: StepOutput) -> None:
        """Append the tokens a constraint forces (exactly one allowed continuation): they are computed in the next
        forward as a chunk instead of one decode step each, and the output is what decoding would have given."""
        budget = request.params.max_new_tokens - len(request.output_ids)
        for proc in request.params.logits_processors:
            forced = getattr(proc, "forced_tokens", None)
            if forced is None or budget <= 0:
                continue
            try:
                tokens = forced(request.request_id, request.output_ids, budget)
            except Exception:  # noqa: BLE001
                return  # the next step's processing reports the error on this request
            if tokens:
                request.num_forced_tokens += len(tokens)
                self.metrics.num_forced_tokens += len(tokens)
                self._append(request, list(tokens), now, result)
            return

    def _fork_children(self, parent: Request) -> list[Request]:
        """At the parent's first sampled token, its forks take its blocks (shared, copy-on-write)."""
        children = self._children.pop(parent.request_id, [])
        for child in children:
            self.kv.fork(parent.request_id, child.request_id)
            child.num_computed_tokens = parent.num_computed_tokens
            child.status = RequestStatus.RUNNING
            self.scheduler.running.append(child)
        return children

    def _end(self, request: Request, status: RequestStatus, reason: str, error: str | None) -> None:
        if reason == "length" and any(
            hasattr(p, "is_complete") and not p.is_complete(request.request_id) for p in request.params.logits_processors
        ):
            reason = "length_incomplete"  # max_new_tokens cut a constrained document short: it will not parse
        if request.params.max_retries:
            decision = self.retrier.end_attempt(request, status, reason)
            if decision.retry is not None:
                self._retry(request, decision.retry)
                return
            if decision.error is not None:
                status, reason, error = RequestStatus.FAILED, "error", decision.error
        request.status, request.finish_reason, request.error = status, reason, error
        request.finish_time = time.perf_counter()
        request.swapped = None
        for proc in request.params.logits_processors:
            if hasattr(proc, "release"):
                proc.release(request.request_id)
        self.speculator.release(request.request_id)
        for child in self._children.pop(request.request_id, []):  # forks of a parent that never sampled
            self._end(child, status, reason, error)
        if status is RequestStatus.FINISHED:
            self.metrics.num_requests_finished += 1
            if request.first_token_time is not None and len(request.output_ids) > 1:
                span = request.last_token_time - request.first_token_time
                self.metrics.time_per_output_token.append(span / (len(request.output_ids) - 1))
        elif reason != "abort":
            self.metrics.num_requests_failed += 1
        if request.parent_id is None:
            self.metrics.num_prompt_tokens_cached += request.num_cached_tokens
            if request.num_computed_tokens or request.output_ids:  # it ran (was admitted at least once)
                self.metrics.num_prompt_tokens_queried += len(request.prompt_ids)
        self._ended.append(request.to_output())

    def _retry(self, request: Request, retry: Request) -> None:
        """Queue the next attempt of a refused request under the same id (its blocks are already freed; the
        prompt's full blocks stay in the prefix cache). The old attempt is marked done ("retry") and never output."""
        for proc in request.params.logits_processors:
            if hasattr(proc, "release"):
                proc.release(request.request_id)
        self.speculator.release(request.request_id)
        request.status, request.finish_reason = RequestStatus.FINISHED, "retry"
        if request.parent_id is None:
            self.metrics.num_prompt_tokens_cached += request.num_cached_tokens
            self.metrics.num_prompt_tokens_queried += len(request.prompt_ids)
        self.metrics.num_prompt_tokens += len(retry.prompt_ids)
        self.requests[retry.request_id] = retry
        self.scheduler.add(retry)

    def _fail_unschedulable(self) -> None:
        """Nothing could run although requests wait: the head of the queue can never fit. Fail it (no hang)."""
        if self.scheduler.running or not self.scheduler.waiting:
            return
        request = self.scheduler.waiting[0][1]
        self.scheduler.remove(request)
        self._end(
            request, RequestStatus.FAILED, "error",
            f"request needs more blocks than the pool can ever free ({self.cache.num_blocks} blocks of "
            f"{self.config.block_size}): raise PagedConfig.num_blocks or lower max_new_tokens",
        )

    def _speculation_unsupported(self) -> str | None:
        """Why rejected drafts could not be rolled back here (None: they can)."""
        if self.cache.compressed:
            return ("needs uncompressed KV blocks (a block quantized when drafts filled it cannot take other tokens "
                    "back): use kv_cache_dtype='auto' and no streaming heads")
        if self.config.kv_eviction is not None:
            return f"does not work with kv_eviction={self.config.kv_eviction!r}: use kv_eviction=None"
        return None

    # -- prefix cache ------------------------------------------------------------------------------------
    def _extra_keys(self, request: Request) -> tuple:
        return (self.config.cache_salt,) if self.config.cache_salt else ()

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (e.g. after the weights changed). Returns the entries dropped."""
        radix = self.kv.prefix_cache
        return radix.reset() if radix is not None else 0

    def _check_weights(self) -> None:
        """Drop the prefix cache when the weights moved since the last check (an optimizer step, a load). Runs on
        steps that may admit requests (one pass over the parameter list), not on every decode step."""
        fingerprint = weights_fingerprint(self.model)
        if fingerprint != self._weights:
            self._weights = fingerprint
            self.reset_prefix_cache()

    # -- drivers -----------------------------------------------------------------------------------------
    def run(self, request_ids: Iterable[str] | None = None, *, on_step=None) -> dict[str, RequestOutput]:
        """Step until the given requests (default: all) have ended; return and forget their outputs."""
        wanted = list(request_ids) if request_ids is not None else list(self.requests)
        while any(not self.requests[rid].is_finished for rid in wanted):
            step = self.step()
            if on_step is not None:
                on_step(step)
        return {rid: self.pop_output(rid) for rid in wanted}

    def stream(self, request_ids: Iterable[str] | None = None) -> Iterator[tuple[str, list[int], bool]]:
        """Yield `(request_id, new_tokens, finished)` as tokens arrive, until the given requests have ended.

        Tokens are read from the requests themselves, so none is missed when another thread steps too."""
        wanted = list(request_ids) if request_ids is not None else list(self.requests)
        seen = dict.fromkeys(wanted, 0)
        while seen:
            if any(not self.requests[rid].is_finished for rid in seen):
                self.step()
            for rid in list(seen):
                request = self.requests[rid]
                if request.params.max_retries and not request.is_finished:
                    continue  # a request that may rerun yields its tokens once it has ended
                tokens = request.output_ids[seen[rid]:]
                seen[rid] += len(tokens)
                if tokens or request.is_finished:
                    yield rid, list(tokens), request.is_finished
                if request.is_finished:
                    del seen[rid]

    def stats(self) -> dict:
        with self._lock:
            return self._stats()

    def _stats(self) -> dict:
        stats = self.metrics.summary(self.config.max_num_batched_tokens)
        stats.update(self.cache.stats())
        stats["preemptions"] = self.scheduler.num_preemptions
        stats["prefix_evictions"] = self.cache.pool.num_evictions
        stats["kv_blocks_evicted"] = self.evictor.num_evictions
        stats["kv_usage"] = stats["blocks_used"] / stats["blocks_total"]
        stats["requests_running"] = len(self.scheduler.running)
        stats["requests_waiting"] = len(self.scheduler.waiting)
        stats.update(self.sampler.constraint_stats.summary())
        stats["retries"] = self.retrier.num_retries
        stats["retried_requests"] = self.retrier.num_retried_requests
        return stats

    def check_integrity(self) -> None:
        self.cache.check_integrity()
        live = {r.request_id for r in self.scheduler.running}
        assert live <= set(self.kv.seqs), "a running request has no block table"
        assert set(self.kv.seqs) <= live, "a block table belongs to no running request"
        self.speculator.check_integrity({rid for rid, r in self.requests.items() if not r.is_finished})
