"""Ctrl-C in the caller: a `KeyboardInterrupt` in the main thread, while it drives the engine loop's steps or waits
for them, leaves no block, request or caller behind, and the next call on the same wrapped model equals stock."""

from __future__ import annotations

import _thread
import random
import signal
import threading
import time

import pytest
import torch
from transformers import LogitsProcessor

import hf_paged
from hf_paged import PagedConfig, SamplingParams
from hf_paged.batching import interrupts
from tests.bounded import bounded
from tests.tiny_models import left_pad, ragged_prompts, stock_greedy, tiny_model

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signals reach the main thread only")


@pytest.fixture
def model():
    wrapped = hf_paged.wrap(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=64))
    yield wrapped
    _bounded(lambda: hf_paged.unwrap(wrapped), 30)  # (a hung loop thread must fail the test, not hang the run)


def _bounded(fn, seconds: float = 60):
    return bounded(fn, seconds, "a hang")


def _settled(engine, seconds: float = 10) -> dict:
    """The engine's gauges once the loop has run the aborts of an interrupted call (bounded)."""
    deadline = time.monotonic() + seconds
    while True:
        stats, loop = engine.stats(), engine.loop
        busy = stats["blocks_used"] or stats["requests_running"] or stats["requests_waiting"] or loop.num_in_flight
        if not busy or time.monotonic() > deadline:
            return {"blocks_used": stats["blocks_used"], "running": stats["requests_running"],
                    "waiting": stats["requests_waiting"], "in_flight": loop.num_in_flight,
                    "requests": len(engine.requests)}
        time.sleep(0.01)


IDLE = {"blocks_used": 0, "running": 0, "waiting": 0, "in_flight": 0, "requests": 0}


class _CtrlCAt(LogitsProcessor):
    """Presses Ctrl-C (SIGINT to this process) at its `at`-th call: inside a step, in the thread running it."""

    def __init__(self, at: int) -> None:
        self.at, self.calls, self.threads = at, 0, set()

    def __call__(self, input_ids, scores):
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.calls == self.at:
            signal.raise_signal(signal.SIGINT)
        return scores


@pytest.mark.parametrize("at", [2, 4])
def test_ctrl_c_inside_a_step_the_main_thread_drives_harms_no_other_caller(model, at):
    """The main thread drives the steps of every caller while its generate runs; a Ctrl-C inside a step (here from
    its processor) cut the step half way: the other thread's request stayed computed but unsampled, its caller
    waited for ever, its blocks stayed taken, and the next call spun in the scheduler. Now the interrupt waits for the
    step's end."""
    engine = hf_paged.engine_of(model)
    mine, other = ragged_prompts([6, 9], seed=2)
    want_mine, want_other = stock_greedy(model, [mine], 8)[0], stock_greedy(model, [other], 30)[0]
    box: dict = {}
    submitted = threading.Event()

    def other_caller():
        try:
            box["other"] = model.generate(torch.tensor([other]), max_new_tokens=30, do_sample=False)[0, 9:].tolist()
        except BaseException as exc:  # noqa: BLE001 -- checked below
            box["other"] = exc

    thread = threading.Thread(target=other_caller, daemon=True)

    class StartOther:  # at this call's first token (the main thread drives by then) the other caller submits
        def __init__(self):
            self.puts = 0

        def put(self, value):
            self.puts += 1
            if self.puts == 2:
                before = engine.loop.num_in_flight
                thread.start()
                deadline = time.monotonic() + 30
                while engine.loop.num_in_flight == before and time.monotonic() < deadline:
                    time.sleep(0.001)
                submitted.set()

        def end(self):
            pass

    ctrl_c = _CtrlCAt(at)
    with pytest.raises(KeyboardInterrupt):
        model.generate(torch.tensor([mine]), max_new_tokens=8, do_sample=False, logits_processor=[ctrl_c],
                       streamer=StartOther())
    assert submitted.is_set() and ctrl_c.threads == {threading.main_thread().name}
    thread.join(60)
    assert not thread.is_alive(), "the other caller never got its output"
    assert box["other"] == want_other
    assert _settled(engine) == IDLE
    engine.check_integrity()
    assert _bounded(lambda: model.generate(torch.tensor([mine]), max_new_tokens=8, do_sample=False))[0, 6:].tolist() \
        == want_mine


def _drain(timer: threading.Timer | None = None, step: _CtrlCAtStep | None = None) -> None:
    """Stop the senders (cancel and join `timer`, disarm `step`), then take an interrupt already sent here, not in
    the next call. Once they are stopped the interrupt flag is set or never will be, and the main thread takes it at
    its next check, inside this loop; one taken anywhere in it (as `join` returns, say) restarts the drain. (The
    sleeps alone were guarded before: an interrupt taken as `join` returned escaped to pytest and ended the run.)"""
    while True:
        try:
            if timer is not None:
                timer.cancel()
                timer.join()
            if step is not None:
                step.arm(0)
            for _ in range(3):
                time.sleep(0.002)
            return
        except KeyboardInterrupt:
            pass


CALLS = {
    "greedy": lambda m, ids, mask, prompts: m.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False),
    "sampled": lambda m, ids, mask, prompts: m.generate_batch(
        prompts, sampling_params=SamplingParams(max_new_tokens=24, temperature=1.0, top_k=20, seed=7)),
    "generate_batch_progress_bar": lambda m, ids, mask, prompts: m.generate_batch(
        prompts, max_new_tokens=24, do_sample=False, progress_bar=True),
    "scoring": lambda m, ids, mask, prompts: m.loglikelihood([(p[:2], p[2:]) for p in prompts]),
}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return [o.generated_tokens for o in a.values()] == [o.generated_tokens for o in b.values()]
    # (a context computed again in other chunks, or by the CPU kernels once they loaded: fp32 sums in another order;
    # the scoring path's promise is a stock forward's numbers within 1e-4)
    return len(a) == len(b) and all(x.is_greedy == y.is_greedy and abs(x.logprob - y.logprob) <= 1e-4
                                    for x, y in zip(a, b))


class _CtrlCAtStep:
    """A step listener that presses Ctrl-C (`_thread.interrupt_main`) at the `at`-th step after `arm`: the signal
    arrives while that step's thread runs it (the main thread, or the loop thread while the main thread waits)."""

    def __init__(self, engine) -> None:
        self.at, self.lock = 0, threading.Lock()  # the lock: no press after `arm(0)` returns
        engine.add_step_listener(self)

    def arm(self, at: int) -> None:
        with self.lock:
            self.at = at

    def __call__(self, step) -> None:
        with self.lock:
            if self.at:
                self.at -= 1
                if not self.at:
                    _thread.interrupt_main()


@pytest.mark.parametrize("kind", list(CALLS))
def test_ctrl_c_at_any_moment_of_a_call_leaves_nothing_behind(model, kind):
    """Ctrl-C at every step of a call, and at 8 moments of a clock: the engine is idle afterwards and the next call
    equals the uninterrupted one (stock's tokens for greedy rows)."""
    engine = hf_paged.engine_of(model)
    prompts = ragged_prompts([5, 17, 9, 12], seed=3)
    ids, mask = left_pad(prompts)
    call = CALLS[kind]
    expected = call(model, ids, mask, prompts)
    if kind == "greedy":
        assert [row[ids.shape[1]:].tolist() for row in expected] == stock_greedy(model, prompts, 24)
    steps = engine.metrics.num_steps
    start = time.perf_counter()
    call(model, ids, mask, prompts)
    duration, num_steps = time.perf_counter() - start, engine.metrics.num_steps - steps
    ctrl_c, rng = _CtrlCAtStep(engine), random.Random(kind)
    moments = [("step", k) for k in range(1, num_steps + 1)] + [("clock", rng.uniform(0, duration)) for _ in range(8)]
    interrupted = 0
    for how, at in moments:
        # started inside the `try`: a timer of ~0 s fired while `start` still waited for its thread, and the
        # interrupt, raised there (threading.py, `Condition.wait`), escaped to pytest and ended the whole run
        timer = threading.Timer(at, _thread.interrupt_main) if how == "clock" else None
        try:
            try:
                if timer is not None:
                    timer.start()
                else:
                    ctrl_c.arm(at)
                call(model, ids, mask, prompts)
            except KeyboardInterrupt:
                interrupted += how == "step"
            ctrl_c.arm(0)
        except KeyboardInterrupt:  # (one at the last step may land after the call returned)
            interrupted += how == "step"
        _drain(timer, ctrl_c)
        assert _settled(engine) == IDLE, (how, at)
        engine.check_integrity()
        assert _same(_bounded(lambda: call(model, ids, mask, prompts)), expected), (how, at)
    assert interrupted >= num_steps - 1  # (one may land after _drain's end: not counted)


def test_ctrl_c_while_waiting_for_the_loop_thread_aborts_only_this_call(model):
    """A main thread that waits (another caller drives) takes Ctrl-C at once; its requests are aborted, the other's
    run on to stock's tokens."""
    engine = hf_paged.engine_of(model)
    mine, other = ragged_prompts([7, 11], seed=5)
    want_other = stock_greedy(model, [other], 60)[0]
    box: dict = {}
    started = threading.Event()

    class Started:
        def put(self, value):
            started.set()

        def end(self):
            pass

    def other_caller():
        box["other"] = model.generate(torch.tensor([other]), max_new_tokens=60, do_sample=False,
                                      streamer=Started())[0, 11:].tolist()

    thread = threading.Thread(target=other_caller, daemon=True)
    thread.start()
    assert started.wait(30)

    class CtrlCOnFirstToken:  # this call's first step ran (driven by the other thread): press Ctrl-C here
        def __init__(self):
            self.puts = 0

        def put(self, value):
            self.puts += 1
            if self.puts == 2:
                _thread.interrupt_main()

        def end(self):
            pass

    with pytest.raises(KeyboardInterrupt):
        model.generate(torch.tensor([mine]), max_new_tokens=200, do_sample=False, streamer=CtrlCOnFirstToken())
    thread.join(60)
    assert not thread.is_alive() and box["other"] == want_other
    assert _settled(engine) == IDLE


def test_a_held_interrupt_reaches_the_replaced_handler_when_the_critical_call_returns():
    """Inside a `@critical` function a SIGINT is noted; the handler it replaced gets it when the outermost critical
    call returns (not when a nested one does), and that handler is the process's again afterwards."""
    seen, inside = [], []

    def mine(signum, frame):
        seen.append(signum)

    @interrupts.critical
    def inner():
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # (the handler runs between bytecodes: it has run by the end of this loop)
            pass

    @interrupts.critical
    def outer():
        inner()
        inside.append(list(seen))

    before = signal.signal(signal.SIGINT, mine)
    try:
        outer()
        assert inside == [[]] and seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
        with interrupts.installed():  # outside critical code the signal goes through at once
            signal.raise_signal(signal.SIGINT)
            for _ in range(1000):
                pass
            assert seen == [signal.SIGINT, signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_second_interrupt_inside_critical_code_goes_through_at_once():
    """A step stuck in user code (a logits processor that never returns) stays interruptible: the first Ctrl-C is
    held, a second raises there and then."""
    ran_on = []

    @interrupts.critical
    def stuck():
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):
            pass
        ran_on.append("after the first")
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):
            pass
        ran_on.append("after the second")  # (never: the second raised inside)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            stuck()
        assert ran_on == ["after the first"] and interrupts._GUARD.pending is None
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


class _GenerateInside:
    """A stopping criterion and a streamer that call `generate` on the same wrapped model (self-checking), between
    the steps of the call they belong to."""

    def __init__(self, model, prompt) -> None:
        self.model, self.prompt, self.nested = model, prompt, []

    def _nested_call(self):
        if len(self.nested) < 2:
            self.nested.append(self.model.generate(self.prompt, max_new_tokens=4, do_sample=False)[0, -4:].tolist())

    def __call__(self, input_ids, scores, **kwargs):  # (StoppingCriteria)
        self._nested_call()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def put(self, value):  # (streamer)
        self._nested_call()

    def end(self):
        pass


@pytest.mark.parametrize("how", ["stopping_criteria", "streamer"])
def test_generate_from_a_criterion_or_streamer_of_the_same_model(model, how):
    """A stopping criterion or streamer runs in the caller's thread between the steps it drives, holding the driver:
    a `generate` there waited for the loop thread, which waited for that driver, for ever. It now drives its own
    turns; both calls equal stock."""
    outer_prompt, inner_prompt = ragged_prompts([9, 6], seed=2)
    want_outer, want_inner = stock_greedy(model, [outer_prompt], 12)[0], stock_greedy(model, [inner_prompt], 4)[0]
    inside = _GenerateInside(model, torch.tensor([inner_prompt]))
    out = _bounded(lambda: model.generate(torch.tensor([outer_prompt]), max_new_tokens=12, do_sample=False,
                                          **{how: [inside] if how == "stopping_criteria" else inside}))
    assert out[0, 9:].tolist() == want_outer
    assert inside.nested == [want_inner, want_inner]
    assert _settled(hf_paged.engine_of(model)) == IDLE
