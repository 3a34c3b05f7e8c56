"""`EngineLoop`: one background thread drives an `Engine` for any number of callers, threads or asyncio tasks.

Why a thread and not an asyncio task: a step is a blocking torch forward (milliseconds up to a second for a long
prefill chunk). As a task it would freeze a server's event loop for that long, and `model.generate` callers in
plain threads have no event loop at all. torch releases the GIL inside its kernels, so callers keep running.
A synchronous caller drives the turns in its own thread unless another synchronous caller does (one `generate` call
at a time keeps the caller's torch threads; `loop_driver.py`), and hands over when its requests end.

    callers (any thread or task)                      the loop thread (the only one that steps for them)
      submit() / generate_async(): ids reserved now  --commands-->  add_request / abort, between two steps
      Submission.result() / async for ...           <--deltas---   step listener: each caller's new tokens
                                                                    and ended requests, once per step

Requests of all callers run in the same steps. The loop sleeps on a condition while it has no request of its own
(no busy-wait). A failing request ends FAILED with its error and the loop goes on; an exception out of a whole
step fails the requests in flight, never the loop. A synchronous submission is handed to the loop only once its
caller reads it: an exception or Ctrl-C between `submit` and `result` leaves nothing running.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from hf_paged.batching import loop_fork
from hf_paged.batching.drivable import Drivable
from hf_paged.batching.interrupts import critical
from hf_paged.batching.loop_driver import Driver
from hf_paged.batching.loop_requests import LoopClosedError, Planned, RequestDelta, Submission, _Sink
from hf_paged.batching.loop_thread import serve, wake
from hf_paged.batching.request import RequestOutput, RequestStatus, StepOutput, checked_submission, fork_ids
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import RequestFailedError, UnsupportedGenerationError

logger = logging.getLogger(__name__)

__all__ = ["EngineLoop", "LoopClosedError", "RequestDelta", "Submission"]

class EngineLoop:
    """Drives one `Engine` from a background thread; every method is thread-safe.

    Example:
        >>> loop = engine.loop                                                            # doctest: +SKIP
        >>> outs = loop.submit([[1, 2, 3]], [SamplingParams(max_new_tokens=8)]).result()  # doctest: +SKIP
        >>> async for delta in loop.generate_async([1, 2, 3], SamplingParams()):          # doctest: +SKIP
        ...     print(delta.new_token_ids, delta.finished)
    """

    def __init__(self, engine: Drivable) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._commands: deque[Callable[[], None]] = deque()
        self._sinks: dict[str, _Sink] = {}  # request id -> its caller; changed under the engine's lock
        self._num_pending = 0  # sequences (forks included) submitted whose add command has not run yet
        self._thread: threading.Thread | None = None
        # Who steps (loop_driver.py). A caller in the thread that loaded the model keeps its torch thread team: the
        # loop thread's own team costs a single caller 1.5x on 2 cores (libgomp throttles once teams outnumber cores)
        self._driver = Driver()
        self._turning: int | None = None  # the thread running a turn (callbacks of its step run in it)
        self._closed: tuple[str | None] | None = None  # no new submissions: (the shutdown's reason,)
        self._stopping = False  # the thread exits once its commands are done
        engine.add_step_listener(self._dispatch)
        loop_fork.register(self)

    # -- callers -----------------------------------------------------------------------------------------
    def submit(
        self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
        request_ids: Sequence[str | None] | None = None, priorities: Sequence[int] | None = None,
        stream: bool = True,
    ) -> Submission:
        """Reserve ids for prompts (one `SamplingParams` each; unique unless given, a given one in use raises
        `ValueError` here); they run from `result()`/`steps()` on. `stream=False`: the caller only wants the outputs,
        so it is not woken at every step (its `steps()` then yield only ended requests)."""
        deltas: queue.SimpleQueue[list[RequestDelta]] = queue.SimpleQueue()
        planned = self._plan(prompts, params, request_ids, priorities, _Sink(deltas.put, stream))
        return Submission(self, planned, deltas)

    async def generate_async(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *, request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestDelta]:
        """Stream one request (and its forks) as deltas. Cancelling the consuming task, or closing the generator
        early (`contextlib.aclosing`), aborts what is still running; its blocks are freed before the next step."""
        if self._callers_drive:
            raise UnsupportedGenerationError(
                "generate_async on a tensor-parallel model: every rank must run the same requests in the same steps, "
                "which requests arriving on their own cannot promise; call generate / generate_batch on every rank")
        event_loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[list[RequestDelta]] = asyncio.Queue()
        sink = _Sink(lambda d: event_loop.call_soon_threadsafe(deltas.put_nowait, d), tokens=True)
        planned = self._plan([prompt_ids], [params], [request_id], [priority], sink)
        remaining = set(planned.all_ids)
        try:
            self.enqueue(planned)
            while remaining:
                for delta in await deltas.get():
                    if delta.finished:
                        remaining.discard(delta.request_id)
                    yield delta
        finally:
            if remaining:
                self.abort(*remaining)

    @critical  # (a Ctrl-C landing as a caller's `finally` calls it would leave its requests running)
    def abort(self, *request_ids: str, error: str | None = None, forks: bool = True) -> None:
        """End these requests before the next step (blocks freed; FAILED with `error`; `forks`: `Engine.abort`'s)."""
        self._command(lambda: [self.engine.abort(rid, error=error, forks=forks) for rid in request_ids])

    def abort_all(self, reason: str | None = None) -> None:
        """Abort every request of this loop's callers before the next step; with `reason`, each ends FAILED with it."""
        self._command(lambda: [self.engine.abort(rid, error=reason) for rid in list(self._sinks)])

    @property
    def num_waiting(self) -> int:
        """Sequences submitted that have not started running (queued here or in the scheduler, forks of `n`)."""
        return self._num_pending + self.engine.num_waiting

    @property
    def num_in_flight(self) -> int:  # requests of this loop's callers that have not ended
        return self._num_pending + len(self._sinks)

    @property
    def is_alive(self) -> bool:
        """True while the loop takes requests (its thread runs, or starts at the first submission)."""
        return not self._closed and (self._thread is None or self._thread.is_alive())

    def start(self) -> None:
        """Start the thread now (it also starts at the first submission)."""
        with self._cond:
            if self._closed:
                raise LoopClosedError("the engine loop was shut down; create a new Engine to serve again")
            if self._thread is None:
                self._thread = threading.Thread(target=serve, args=(weakref.ref(self), self._cond),
                                                name="hf_paged-engine-loop", daemon=True)
                weakref.finalize(self, wake, self._cond)  # a loop nobody holds is collected: its thread ends
                self._thread.start()

    def run_in_this_thread(self, on_ready: Callable[[], None] | None = None) -> None:
        """Make the calling thread the loop thread and run the loop until `shutdown` (instead of `start`). A server
        that loads its model in this same thread keeps one torch thread team (loop_driver.py). `on_ready` is called
        once the thread is registered, before the first turn."""
        with self._cond:
            if self._closed or self._thread is not None:
                raise RuntimeError("the engine loop already has a thread (or was shut down)")
            self._thread = threading.current_thread()
        if on_ready is not None:
            on_ready()
        serve(lambda: self, self._cond)  # (holding the loop: the caller's thread owns it)

    def shutdown(self, timeout: float = 0.0, reason: str | None = None) -> None:
        """Take no new requests, give those in flight up to `timeout` seconds to finish, abort the rest (failed with
        `reason` when given), and stop the thread. The engine itself stays usable directly."""
        with self._cond:
            self._closed = (reason,)
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout
        while self.num_in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        self.abort_all(reason)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def follow(self, deltas: queue.SimpleQueue[list[RequestDelta]], pending: Callable[[], bool],
               on_lost: Callable[[], None], enqueue: Callable[[], None]) -> Iterator[list[RequestDelta]]:
        """A synchronous caller's deltas from its queue while `pending()`. Unless another synchronous caller
        drives, the caller's own thread drives the turns (loop_driver.py) and hands over to the loop thread when it
        leaves; `enqueue` adds its requests once that is settled; `on_lost` is called when there is nothing left
        to run yet `pending()` holds. A caller in the thread that drives already (a streamer or stopping criterion
        of its call, run between turns, calling `generate` again) drives its own turns too: waiting for the loop
        thread, which waits for the driver, it waited for ever."""
        me = threading.get_ident()
        nested = self._driver.owner == me
        try:
            if not nested:
                self._take_driver(me)
            enqueue()
            while pending():
                if self._driver.owner == me:
                    while deltas.empty() and pending():
                        if not self._turn():
                            on_lost()
                yield deltas.get()
        finally:
            if not nested and self._driver.owner == me:
                self._hand_over()

    @critical  # (cut between the two, the driver would stay taken by a caller that has left)
    def _take_driver(self, me: int) -> None:
        self._driver.take(me, always=self._callers_drive)

    # -- submission ----------------------------------------------------------------------------------------
    def _plan(self, prompts, params, request_ids, priorities, sink: _Sink) -> Planned:
        """Reserve the ids of a submission and build the command that adds it; nothing runs until `enqueue`."""
        prompts, params, levels = checked_submission(prompts, params, priorities)  # (the caller's errors: raised)
        if self._turning == threading.get_ident():  # it would wait for the step it is called from: for ever
            raise UnsupportedGenerationError(
                "generate called from inside a step of the same wrapped model (a processor, criterion or streamer of "
                "another call): call it after that one returns, or use stock generate (type(model).generate(model, ...))")
        if self._closed:
            raise LoopClosedError("the engine loop was shut down; it takes no new requests")
        planned = Planned()
        weakref.finalize(planned, self._give_back, planned.request_ids, planned.queued).atexit = False
        self._reserve(prompts, params, request_ids, levels, sink, planned)
        return planned

    @critical  # (a Ctrl-C cutting it would leave ids reserved and unknown to the caller)
    def _reserve(self, prompts, params, request_ids, levels, sink: _Sink, planned: Planned) -> None:
        wanted = list(request_ids) if request_ids is not None else [None] * len(prompts)
        try:
            for rid in wanted:
                planned.request_ids.append(self.engine.reserve_request_id(rid))
        except (ValueError, TypeError):  # (an id in use, or not a str)
            self.engine.release_request_ids(planned.request_ids)
            planned.request_ids.clear()
            raise
        ids = planned.request_ids
        all_ids = [c for rid, p in zip(ids, params) for c in fork_ids(rid, p.num_return_sequences)]
        items = list(zip(ids, prompts, params, levels))
        submitted = time.perf_counter()  # TTFT counts from here, not from when the loop got to the request

        def add() -> None:
            with self.engine.lock:
                self._num_pending -= len(all_ids)
                for rid in all_ids:
                    self._sinks[rid] = sink
                for rid, prompt, p, priority in items:  # bad input ends FAILED here: delivered after the next step
                    try:
                        self.engine.add_reserved_request(rid, prompt, p, priority, arrival_time=submitted)
                    except Exception as exc:  # noqa: BLE001 -- a request the engine refused outright fails alone
                        logger.exception("hf_paged engine loop: adding %s failed", rid)
                        self._fail_unadded(rid, p, f"{type(exc).__name__}: {exc}", type(exc))

        add.request_ids = ids  # type: ignore[attr-defined]  # (a forked child gives them back: loop_fork.py)
        planned.all_ids, planned.add = all_ids, add

    @critical  # (cut, the pending count would be off or the queue's lock taken)
    def enqueue(self, planned: Planned, *, wake: bool = True) -> None:
        """Hand a planned submission to the loop (added at the next turn; once). `wake=False`: the caller drives."""
        with self._cond:
            if planned.queued[0] or self._stopping:  # (stopped since `submit`: `follow` tells the caller so)
                return
            planned.queued[0] = True
            self._num_pending += len(planned.all_ids)
            closed = self._closed
        self._command(planned.add, wake=wake)
        if closed:  # shut down since `submit`: its requests end at once, as those in flight did (with its reason)
            self.abort(*planned.all_ids, error=closed[0])

    def _give_back(self, request_ids: list[str], queued: list[bool]) -> None:
        """A planned submission dropped before `enqueue` (an exception or Ctrl-C before its caller read it): its ids
        go back at the next turn (a finalizer's work: it must not wait on the ids' lock; `_cond`'s is reentrant)."""
        with self._cond:
            if not queued[0]:
                queued[0] = True
                self._commands.append(lambda: self.engine.release_request_ids(request_ids))

    @critical
    def _command(self, command: Callable[[], None], *, force: bool = False, wake: bool = True) -> None:
        """Queue `command` for the next turn. `wake=False`: the caller will drive the turns itself if it can (a
        synchronous submission); whoever drives next runs it in any case."""
        with self._cond:
            if self._stopping and not force:
                return
            self._commands.append(command)
            if wake:
                self._cond.notify()
        if self._thread is None and not self._closed:
            self.start()

    @critical  # (a Ctrl-C between the two would leave the other callers' requests unstepped)
    def _hand_over(self) -> None:
        """A synchronous caller stops driving: other callers' requests may still run, the loop thread takes over."""
        self._driver.release()
        with self._cond:
            self._cond.notify()

    # -- the loop thread -----------------------------------------------------------------------------------
    def _has_work(self) -> bool:
        """A shutdown, or commands or callers' requests nobody else steps (read under `_cond`)."""
        others = self._callers_drive or self._driver.callers_waiting
        return bool(self._stopping or (not others and (self._commands or self._sinks)))

    @property
    def _callers_drive(self) -> bool:
        """Tensor parallelism (the sampler syncs the ranks): every rank must issue the same collectives in the same
        order, its forwards' and its caller's between steps (the first rank's stopping verdicts, `generate`), and a
        caller's abort must take effect at the same step on every rank. So the synchronous caller drives its own
        requests' steps, and the loop thread never steps (taking a call's steps when it woke at the end of the
        previous one, it interleaved them with the caller's collectives: "collective mismatch")."""
        return getattr(getattr(self.engine, "sampler", None), "sync", None) is not None

    def _one_turn(self, stopping: bool) -> bool:
        """One turn of the loop thread; False when the thread is to end."""
        with self._driver.loop_turn():  # waits while a synchronous caller drives its own turns
            self._turn()  # when stopping, this delivers the aborted requests' outputs
            if stopping and not self._commands:
                if self._sinks:
                    self._fail_in_flight("the engine loop shut down")
                return False
        return True

    @critical
    def _turn(self) -> bool:
        """Run the queued commands, then one step if a caller waits for requests (the driver lock is held).
        Returns False when there was nothing to do. In the main thread a Ctrl-C waits for the turn's end
        (`interrupts.py`): cut inside a step, it left the pool, the requests and other callers' deliveries half
        changed."""
        with self._cond:
            commands = list(self._commands)
            self._commands.clear()
        self._turning = threading.get_ident()
        try:
            for command in commands:
                try:
                    command()
                except Exception:  # noqa: BLE001 -- a bad command must not stop the loop
                    logger.exception("hf_paged engine loop: a command failed")
            if self._sinks:
                self._step()
        finally:
            self._turning = None
        return bool(commands or self._sinks)

    def _step(self) -> None:
        try:
            self.engine.step()
        except Exception as exc:  # noqa: BLE001 -- the step failed as a whole: its requests fail, the loop goes on
            logger.exception("hf_paged engine loop: a step failed")
            self._fail_in_flight(f"engine step failed: {type(exc).__name__}: {exc}", type(exc))
            return
        if not self.engine.has_unfinished:  # every caller's request must have been delivered by now
            lost = [rid for rid in self._sinks if rid not in self.engine.requests]
            if lost:
                self._fail_in_flight("the request left the engine without an output (popped by another caller?)")

    def _fail_unadded(self, request_id: str, params: SamplingParams, error: str,
                      error_type: type[BaseException]) -> None:
        """End a request that never entered the engine (and its forks) with `error` (of class `error_type`)."""
        self.engine.release_request_ids([request_id])
        for rid in fork_ids(request_id, params.num_return_sequences):
            if rid in self.engine.requests:
                self.engine.abort(rid, error=error, error_type=error_type)  # a fork already added: output next step
                continue
            sink = self._sinks.pop(rid, None)
            if sink is not None:
                output = RequestOutput(rid, [], [], RequestStatus.FAILED, error=error, finish_reason="error",
                                       error_type=error_type)
                self._deliver(sink, [RequestDelta(rid, [], output)])

    def _fail_in_flight(self, error: str, error_type: type[BaseException] = RequestFailedError) -> None:
        with self.engine.lock:
            for rid in list(self._sinks):
                try:
                    self.engine.abort(rid, error=error, error_type=error_type)
                except Exception:  # noqa: BLE001
                    logger.exception("hf_paged engine loop: aborting %s failed", rid)
            self._dispatch(StepOutput(finished=self.engine.take_ended()))
            for rid in list(self._sinks):  # whatever the engine could not end
                output = RequestOutput(rid, [], [], RequestStatus.FAILED, error=error, finish_reason="error",
                                       error_type=error_type)
                self._deliver(self._sinks.pop(rid), [RequestDelta(rid, [], output)])

    def _dispatch(self, step: StepOutput) -> None:
        """Step listener (the stepping thread, under the engine's lock): hand each caller its deltas."""
        if not self._sinks:
            return
        per_caller: dict[int, tuple[_Sink, dict[str, RequestDelta]]] = {}
        for rid, tokens in step.new_tokens.items():
            sink = self._sinks.get(rid)
            if sink is not None and sink.tokens:
                per_caller.setdefault(id(sink), (sink, {}))[1][rid] = RequestDelta(
                    rid, tokens, new_logprobs=step.new_logprobs.get(rid), new_scores=step.new_scores.get(rid))
        for output in step.finished:
            sink = self._sinks.pop(output.request_id, None)
            if sink is None:
                continue
            self.engine.forget(output.request_id)  # the caller holds the output now
            deltas = per_caller.setdefault(id(sink), (sink, {}))[1]
            deltas.setdefault(output.request_id, RequestDelta(output.request_id, [])).output = output
        for sink, deltas in per_caller.values():
            self._deliver(sink, list(deltas.values()))

    def _deliver(self, sink: _Sink, deltas: list[RequestDelta]) -> None:
        try:
            sink.put(deltas)
        except Exception:  # noqa: BLE001 -- e.g. the caller's event loop is closed: nobody will read these requests
            self._command(lambda: [self.engine.abort(d.request_id) for d in deltas if not d.finished], force=True)
