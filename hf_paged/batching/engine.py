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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType

import torch

from hf_paged.batching.appending import TokenAppender
from hf_paged.batching.engine_stats import engine_stats
from hf_paged.batching.kv_pruning import KVPruner
from hf_paged.batching.lifecycle import RequestLifecycle
from hf_paged.batching.metrics import EngineMetrics
from hf_paged.batching.model_runner import ModelRunner
from hf_paged.batching.prefix_policy import PrefixPolicy
from hf_paged.batching.prompt_check import PromptLimits, check_prompt
from hf_paged.batching.prompt_logprobs import record_scored_rows
from hf_paged.batching.request import Failure, Request, RequestOutput, RequestStatus, StepOutput, checked_arguments
from hf_paged.batching.request import token_ids as request_tokens
from hf_paged.batching.request_ids import RequestIds
from hf_paged.batching.sampler import Sampler, plain_greedy_step
from hf_paged.batching.sampling import SamplingParams
from hf_paged.batching.scheduler import Scheduler, SchedulerOutput
from hf_paged.batching.speculative import Speculator, speculation_unsupported
from hf_paged.batching.step_inputs import build_step_inputs
from hf_paged.batching.step_sampling import StepSampling
from hf_paged.batching.swap import swap_in, swap_out
from hf_paged.batching.weights import weights_fingerprint
from hf_paged.cache.block_size import resolve_block_size
from hf_paged.cache.kernels import check_backend as check_attention_backend
from hf_paged.cache.model_support import check_supported
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.sizing import kv_shape_of
from hf_paged.compat import execution_device
from hf_paged.config import PagedConfig
from hf_paged.errors import HfPagedError, OutOfBlocksError, RequestFailedError
from hf_paged.kv_transfer import KVStore, connector_for, model_changed


class Engine:
    """Continuous batching over a stock transformers causal LM.

    Example:
        >>> engine = Engine(model, PagedConfig(max_num_batched_tokens=256))          # doctest: +SKIP
        >>> rid = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=8))     # doctest: +SKIP
        >>> while engine.has_unfinished: engine.step()                                # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, config: PagedConfig | None = None, *, kv_store: KVStore | None = None):
        check_supported(model)  # what `wrap` refuses, refused here too (the server and replicas build engines)
        self.model = model
        dtype, device = next(model.parameters()).dtype, execution_device(model)  # (offloaded weights: the hooks')
        self.config = resolve_block_size(config or PagedConfig(), model.config, dtype, device)  # "auto"
        check_attention_backend(self.config.attention_backend, device, setting="PagedConfig.attention_backend")
        self.cache = PagedCache(model.config, self.config, dtype=dtype, device=device,
                                prefix_cache=self.config.enable_prefix_caching)
        self.kv = self.cache.manager
        self.scheduler = Scheduler(
            self.config, self.kv, extra_keys=self._extra_keys,
            on_preempt=lambda r: swap_out(self.cache, r), on_resume=lambda r: swap_in(self.cache, r),
            prefix_policy=PrefixPolicy(self.kv.prefix_cache, self.config.block_size, self._extra_keys)
            if self.kv.prefix_cache is not None else None,
            kv_transfer=connector_for(self.config, self.cache, model, kv_store),  # the disk tier, or kv_store
        )
        self.runner = ModelRunner(model, self.cache)
        self.pruner = KVPruner(self.config, self.kv, self.cache.kv_shape.num_layers)
        self.sampler = Sampler()
        self.metrics = EngineMetrics()
        self._arrivals = itertools.count()
        self._ids = RequestIds(self.scheduler.requests)
        self._reserved_ids = self._ids.reserved  # ids handed out by `reserve_request_id`, not yet added
        # The engine's one lock: held by every call that changes requests or the pool, and by every step (callers
        # in several threads never see a half-done step). `EngineLoop` takes it to add a caller's requests at once.
        self.lock = threading.RLock()
        self._step_listeners = [] if (kt := self.scheduler.kv_transfer) is None else [kt.step_ended]  # it times steps
        self._loop = None  # the EngineLoop, created by `loop` at first use
        text_config = model.config.get_text_config(decoder=True)
        self.vocab_size = int(text_config.vocab_size)
        self.max_model_len = kv_shape_of(model.config).max_model_len
        self._weights = weights_fingerprint(model)
        self.speculator = Speculator(
            self.kv, self.config, num_blocks=self.cache.num_blocks, vocab_size=self.vocab_size,
            max_model_len=self.max_model_len, unsupported=speculation_unsupported(self.config, self.cache.compressed),
        )
        # ends, retries and forks (lifecycle.py); new tokens, jump-forward and stop checks (appending.py)
        self.lifecycle = RequestLifecycle(self.scheduler, self.kv, self.speculator, self.metrics)
        self.retrier = self.lifecycle.retrier
        self.appender = TokenAppender(self.lifecycle, self.metrics, self.max_model_len)
        self.sampling = StepSampling(self.sampler, self.speculator, self.lifecycle, self.appender, self.metrics)

    # -- requests ----------------------------------------------------------------------------------------
    def add_request(
        self, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams | None = None, *,
        request_id: str | None = None, priority: int = 0,
    ) -> str:
        """Queue a prompt; returns its id (unique in this engine when not given). Bad values (an empty or too long
        prompt, ids outside the vocabulary) do not raise: the request ends FAILED with `error`. Arguments of the
        wrong kind (a text prompt) raise `TypeError`; a `request_id` already in use raises `ValueError`."""
        prompt_ids, params = checked_arguments(prompt_ids, params, priority)  # (before an id is claimed for it)
        return self._add(self.reserve_request_id(request_id), prompt_ids, params, priority)

    def reserve_request_id(self, request_id: str | None = None) -> str:
        """Claim a request id before `add_request` (a new unique one when None); thread-safe, never waits for a
        step. Raises `ValueError` when the given id is in use or already claimed."""
        return self._ids.reserve(request_id)

    def release_request_ids(self, request_ids: Iterable[str]) -> None:
        """Give back ids claimed with `reserve_request_id` that will not be added."""
        self._ids.release(request_ids)

    def add_reserved_request(
        self, request_id: str, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams | None = None,
        priority: int = 0, *, arrival_time: float | None = None,
    ) -> str:
        """`add_request` under an id claimed earlier with `reserve_request_id`. `arrival_time`: when the caller
        submitted it (`time.perf_counter()`), so TTFT counts the wait before it reached the engine."""
        prompt_ids, params = checked_arguments(prompt_ids, params, priority)  # (the caller holds the id: release it)
        return self._add(request_id, prompt_ids, params, priority, arrival_time)

    def _add(self, request_id: str, prompt_ids: list[int], params: SamplingParams, priority: int,
             arrival_time: float | None = None) -> str:
        """Checked arguments (`checked_arguments`) under a claimed id, taken here."""
        with self.lock:
            self._ids.take(request_id)
            request = Request(request_id, prompt_ids, params, priority, next(self._arrivals))
            if arrival_time is not None:
                request.arrival_time = arrival_time
            error = self.validate_prompt(request.prompt_ids, params) or self.speculator.check(params)
            (self.scheduler.register if error is not None else self.scheduler.add)(request)
            self.lifecycle.add_forks(request)  # (a refused request's forks end with it, each with an output)
            if error is not None:
                self.lifecycle.end(request, RequestStatus.FAILED, "error", Failure(str(error), type(error)))
                return request_id
            for constraint in request.processors.constraints:
                constraint.prepare()  # constraints compile in the background while the prompt prefills
            scored = len(request.prompt_ids) + (params.score_targets is not None)  # + a scoring's last target, as usage
            self.metrics.num_prompt_tokens += scored * params.num_return_sequences
            return request_id

    def validate_prompt(self, prompt_ids: Sequence[int], params: SamplingParams, *, whole_sequence: bool = False,
                        **wording: str) -> HfPagedError | None:
        """Why a prompt cannot run, as the error to raise (`InvalidPromptError`, `PromptTooLongError`), or None
        (`prompt_check.py`; `whole_sequence`: the pool must hold `max_new_tokens` more too; `wording`: its words)."""
        limits = PromptLimits(self.vocab_size, self.max_model_len, self.config.block_size, self.cache.num_blocks,
                              None if self.config.enable_chunked_prefill else self.config.max_num_batched_tokens)
        return check_prompt(prompt_ids, params, limits, whole_sequence=whole_sequence, **wording)

    def abort(self, request_id: str, *, error: str | None = None,
              error_type: type[BaseException] = RequestFailedError, forks: bool = True) -> None:
        """End a request now, with its `n` forks (a fork id: that fork alone; `forks=False`: a parent alone, its
        forks that run on their own go on); blocks go back to the pool at once. With `error`, it ends FAILED with it
        (finish reason "error"; `error_type`: its class), else as aborted."""
        with self.lock:
            request = self.scheduler.requests.get(request_id)
            if request is not None:
                failure = Failure(error, error_type) if error is not None else None
                (self.lifecycle.abort_with_forks if forks else self.lifecycle.abort)(request, failure)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    @property
    def num_waiting(self) -> int:
        """Sequences not running yet: requests queued for admission and forks waiting for their parent (`n`)."""
        return len(self.scheduler.waiting) + self.lifecycle.num_waiting_forks

    @property
    def requests(self) -> Mapping[str, Request]:
        """Every request this engine knows, by id (read-only: the scheduler owns them). Requests leave it when
        their output is collected (`pop_output`, `forget`, or the engine loop handing it to its caller)."""
        return MappingProxyType(self.scheduler.requests)

    def live_requests(self) -> list[Request]:
        """The requests not yet ended, as a copy; any thread may call it without waiting for a step."""
        return self.scheduler.live_requests()

    def pop_output(self, request_id: str) -> RequestOutput:
        """The output of an ended request, forgetting it. Raises `KeyError` for an unknown id."""
        with self.lock:
            request = self.scheduler.requests.get(request_id)
            if request is None:
                raise KeyError(f"no request {request_id!r} in this engine: an id from add_request, not popped or "
                               "forgotten yet")
            if not request.ended:
                raise ValueError(f"request {request_id!r} has not ended; abort it or step until it ends")
            self.scheduler.forget(request_id)
            return request.to_output()

    def forget(self, request_id: str) -> None:
        """Drop an ended request whose output the caller already holds (e.g. from a step's `finished` list)."""
        with self.lock:
            request = self.scheduler.requests.get(request_id)
            if request is not None and request.ended:
                self.scheduler.forget(request_id)

    @property
    def loop(self):
        """The `EngineLoop` that drives this engine from one background thread for any number of callers
        (threads or asyncio tasks); created at first use, its thread started at the first submission."""
        if self._loop is None:
            from hf_paged.batching.engine_loop import EngineLoop

            with self._ids.lock:
                if self._loop is None:
                    self._loop = EngineLoop(self)
        return self._loop

    def take_ended(self) -> list[RequestOutput]:
        """Outputs of requests ended since the last step (aborts between steps), handed out once."""
        with self.lock:
            return self.lifecycle.take_ended()

    def add_step_listener(self, listener: Callable[[StepOutput], None]) -> None:
        """Call `listener(step_output)` after every step, in the stepping thread, under the engine's lock: it must
        be quick and must not call back into the engine."""
        self._step_listeners.append(listener)

    # -- the step loop -----------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        with self.lock:
            if self.scheduler.waiting:  # the prefix cache is only read when requests are admitted: check there
                self._check_weights()
            result = StepOutput()
            for failure in self.speculator.propose(self.scheduler.running):
                self.lifecycle.fail(failure.request, failure.error)
            schedule = self.scheduler.schedule()
            if schedule.is_empty:
                self._fail_unschedulable(schedule)
            else:
                self._run(schedule, result)
            result.finished = self.lifecycle.take_ended()
            for listener in self._step_listeners:
                listener(result)
            return result

    def _run(self, schedule: SchedulerOutput, result: StepOutput) -> None:
        self.metrics.peak_blocks_used = max(self.metrics.peak_blocks_used, self.cache.pool.num_used_blocks)
        inputs = build_step_inputs(schedule, self.kv, self.config.block_size, self.config.attention_backend,
                                   self.pruner.observation_window)
        self.pruner.annotate(schedule, inputs.metadata)
        # every row plain greedy: the runner returns the tokens (the certified bf16 head, certified_head.py)
        greedy = self.runner.certified is not None and plain_greedy_step(inputs, self.lifecycle.children)
        try:
            call = self.runner.greedy_tokens if greedy else self.runner.forward
            logits = call(inputs.input_ids, inputs.positions, inputs.metadata, inputs.logits_rows)
        except Exception as exc:  # noqa: BLE001 -- the forward failed: its requests fail, the engine goes on
            failure = Failure.of(exc, "forward failed")
            for item in schedule.scheduled:
                self.lifecycle.fail(item.request, failure)
            return
        for i in inputs.metadata.sparse_rows:  # chunks attended block-sparsely: their K/V are no plain prefill's
            item = schedule.scheduled[i]
            self.kv.end_prefix(item.request.request_id, item.request.num_computed_tokens)
        self.metrics.num_steps += 1
        self.metrics.num_computed_tokens += len(inputs.input_ids)
        self.metrics.recent_step_tokens.append(len(inputs.input_ids))
        for item in schedule.scheduled:
            item.request.num_computed_tokens += item.num_tokens
        self.pruner.after_forward(schedule, inputs.metadata)  # token pruning drops blocks before they can be shared
        for item in schedule.scheduled:
            request = item.request
            if self.kv.has_uncached_full_blocks(request.request_id, request.num_computed_tokens):
                tokens = self.pruner.cacheable_tokens(request, request.all_token_ids[: request.num_computed_tokens])
                self.kv.cache_full_blocks(request.request_id, tokens, self._extra_keys(request))
        if inputs.scored:  # scoring rows come after the sampled ones; a request whose prompt is done has ended
            num_sampled_rows = len(logits) - sum(rows.count for rows in inputs.scored)
            record_scored_rows(inputs.scored, logits[num_sampled_rows:])  # (and their top-k, logprobs)
            logits = logits[:num_sampled_rows]
            for rows in inputs.scored:
                if rows.request.num_computed_tokens == rows.request.num_tokens:
                    self.lifecycle.finish(rows.request, "scored")
        self.sampling.sample(inputs, logits, result, greedy=greedy)  # steps 6-7 (step_sampling.py)

    def _fail_unschedulable(self, schedule: SchedulerOutput) -> None:
        """Nothing ran or was preempted while requests wait: the one admission stopped on never fits; fail it. Or the
        one running request cannot get the blocks of its next tokens from the whole pool (`SchedulerOutput.stuck`)."""
        if schedule.stuck is not None:
            self.lifecycle.fail(schedule.stuck, self._out_of_blocks())
            return
        if (self.scheduler.running or not self.scheduler.waiting or self.scheduler.is_loading or schedule.preempted
                or schedule.num_load_tokens):
            return  # something runs, nothing waits, blocks are read or were written for a waiting one, room was made
        self.lifecycle.fail(schedule.blocked or self.scheduler.waiting[0][1], self._out_of_blocks())

    def _out_of_blocks(self) -> Failure:
        num_pinned = self.kv.prefix_cache.num_pinned_blocks if self.kv.prefix_cache is not None else 0
        held, fix = ((f", {num_pinned} of them held by pinned prefixes", "unpin_prefix, lower PagedConfig."
                      "prefix_pin_share, raise num_blocks") if num_pinned else ("", "raise PagedConfig.num_blocks"))
        return Failure(  # (pins never free themselves)
            f"request needs more blocks than the pool can ever free ({self.cache.num_blocks} blocks of "
            f"{self.config.block_size}{held}): {fix} or lower max_new_tokens", OutOfBlocksError)

    # -- prefix cache ------------------------------------------------------------------------------------
    def _extra_keys(self, request: Request) -> tuple:
        return self.config.block_extra_keys

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (e.g. after the weights changed). Returns the entries dropped. Pins end with
        it (`pin_prefix`: their KV is what is being dropped; a later `unpin_prefix` of them returns 0): pin again once
        a request has computed the prefix anew."""
        with self.lock:  # (not while another thread steps)
            return self.kv.prefix_cache.reset() if self.kv.prefix_cache is not None else 0

    def pin_prefix(self, token_ids: Sequence[int]) -> int:
        """Keep a cached prefix out of eviction until `unpin_prefix`: `KVCacheManager.pin_prefix`."""
        with self.lock:
            return self.kv.pin_prefix(request_tokens(token_ids), self.config.block_extra_keys,
                                      self.config.prefix_pin_share)  # (ids checked: floats, texts were truncated)

    def unpin_prefix(self, token_ids: Sequence[int]) -> int:
        """Undo one `pin_prefix` of the longest pinned prefix of `token_ids`; returns its tokens (0: none)."""
        with self.lock:
            return self.kv.unpin_prefix(request_tokens(token_ids), self.config.block_extra_keys)

    def _check_weights(self) -> None:
        """Drop the prefix cache (and the disk tier's older blocks) when the weights moved (an optimizer step, a
        load) or the modules compute otherwise (a hook, an adapter off). On steps that may admit requests only."""
        fingerprint, before = weights_fingerprint(self.model), self._weights
        if fingerprint != before:
            self._weights = fingerprint
            self.reset_prefix_cache()
            model_changed(self.scheduler.kv_transfer, behaviour=fingerprint.behaviour != before.behaviour)
            if fingerprint.weights != before.weights:
                self.runner.model_changed()

    # -- drivers -----------------------------------------------------------------------------------------
    def run(self, request_ids: Iterable[str] | None = None, *, on_step=None) -> dict[str, RequestOutput]:
        """Step until the given requests (default: all) have ended; return and forget their outputs."""
        wanted = self._wanted(request_ids, "run")
        while any(not self.requests[rid].ended for rid in wanted):
            step = self.step()
            if on_step is not None:
                on_step(step)
        return {rid: self.pop_output(rid) for rid in wanted}

    def stream(self, request_ids: Iterable[str] | None = None) -> Iterator[tuple[str, list[int], bool]]:
        """Yield `(request_id, new_tokens, finished)` as tokens arrive, until the given requests have ended.

        Tokens are read from the requests themselves, so none is missed when another thread steps too."""
        seen = dict.fromkeys(self._wanted(request_ids, "stream"), 0)
        while seen:
            if any(not self.requests[rid].ended for rid in seen):
                self.step()
            for rid in list(seen):
                request = self.requests[rid]
                if request.params.max_retries and not request.ended:
                    continue  # a request that may rerun yields its tokens once it has ended
                tokens = request.output_ids[seen[rid]:]
                seen[rid] += len(tokens)
                if tokens or request.ended:
                    yield rid, list(tokens), request.ended
                if request.ended:
                    del seen[rid]

    def _wanted(self, request_ids: Iterable[str] | None, method: str) -> list[str]:
        """`run` / `stream`'s ids: every request's by default; one id alone (a str, once read as its characters) or
        an unknown one is a `TypeError` / `KeyError` naming it."""
        if request_ids is None:
            return list(self.requests)
        if isinstance(request_ids, str):
            raise TypeError(f"Engine.{method} takes a list of request ids, got the str {request_ids!r}: pass "
                            f"[{request_ids!r}]")
        wanted = list(request_ids)
        unknown = [rid for rid in wanted if rid not in self.requests]
        if unknown:
            raise KeyError(f"Engine.{method}: no request {unknown[0]!r} in this engine: an id from add_request, not "
                           "popped or forgotten yet")
        return wanted

    def stats(self) -> dict:
        """Counters and gauges of the engine, its cache, scheduler, sampler and retries (`engine_stats.py`)."""
        with self.lock:
            return engine_stats(metrics=self.metrics, max_num_batched_tokens=self.config.max_num_batched_tokens,
                                cache=self.cache, scheduler=self.scheduler, pruner=self.pruner, sampler=self.sampler,
                                lifecycle=self.lifecycle, runner=self.runner)

    def check_integrity(self) -> None:
        self.cache.check_integrity()
        live = {r.request_id for r in self.scheduler.running}
        assert live <= set(self.kv.seqs), "a running request has no block table"
        assert set(self.kv.seqs) <= live, "a block table belongs to no running request"
        self.speculator.check_integrity({rid for rid, r in self.requests.items() if not r.ended})
