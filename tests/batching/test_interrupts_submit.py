"""Ctrl-C between `EngineLoop.submit` and the first step of the submitted requests: the caller's requests are
released (aborted, blocks freed) whatever Python call the interrupt lands in, for `generate`, `generate_batch` and
scoring."""

from __future__ import annotations

import signal
import sys
import threading

import pytest

import hf_paged
from hf_paged import PagedConfig
from hf_paged.batching.engine_loop import EngineLoop
from tests.batching.test_interrupts import IDLE, _bounded, _drain, _same, _settled
from tests.tiny_models import left_pad, ragged_prompts, tiny_model

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signals reach the main thread only")

CALLS = {
    "generate": lambda m, ids, mask, prompts: m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False),
    "generate_streamer": lambda m, ids, mask, prompts: m.generate(
        ids[:1], attention_mask=mask[:1], max_new_tokens=4, do_sample=False, streamer=_Quiet()),
    "generate_batch": lambda m, ids, mask, prompts: m.generate_batch(prompts, max_new_tokens=4, do_sample=False),
    "scoring": lambda m, ids, mask, prompts: m.loglikelihood([(p[:2], p[2:]) for p in prompts]),
}


class _Quiet:
    def put(self, value):
        pass

    def end(self):
        pass


class _CtrlCAtCall:
    """A trace function that sends SIGINT at the `at`-th Python call made in the main thread from the entry of
    `EngineLoop.submit` until the engine's first step: the interrupt lands wherever Python next checks for
    signals (held inside `@critical` code, as a real Ctrl-C)."""

    def __init__(self, engine, at: int) -> None:
        self.at, self.calls, self.armed, self.fired = at, 0, False, False
        self.step_code = type(engine).step.__code__

    def __call__(self, frame, event, arg):
        if event != "call" or threading.current_thread() is not threading.main_thread():
            return
        code = frame.f_code
        if code is EngineLoop.submit.__code__:
            self.armed = True
        elif code is self.step_code:
            self.armed = False
        if self.armed and not self.fired:
            self.calls += 1
            if self.calls == self.at:
                self.fired = True
                signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("kind", list(CALLS))
def test_ctrl_c_between_submit_and_the_first_step_releases_the_requests(kind):
    model = hf_paged.wrap(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=64))
    try:
        engine = hf_paged.engine_of(model)
        prompts = ragged_prompts([5, 9], seed=3)
        ids, mask = left_pad(prompts)
        call = CALLS[kind]
        expected = call(model, ids, mask, prompts)
        at, misses = 0, 0
        while misses < 3:
            at += 1
            tracer = _CtrlCAtCall(engine, at)
            sys.settrace(tracer)
            try:
                try:
                    call(model, ids, mask, prompts)
                finally:
                    sys.settrace(None)
            except KeyboardInterrupt:
                pass
            _drain()
            misses = misses + 1 if not tracer.fired else 0
            assert _settled(engine) == IDLE, (at, tracer.calls)
            engine.check_integrity()
            assert _same(_bounded(lambda: call(model, ids, mask, prompts)), expected), at
        assert at > 60  # (the sweep met that many calls between submit and the first step)
    finally:
        _bounded(lambda: hf_paged.unwrap(model), 30)
