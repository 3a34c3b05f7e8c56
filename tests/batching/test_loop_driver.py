"""A synchronous `generate` drives its own steps, even when it arrives while the loop thread holds a turn: its
stopping criteria's verdicts then take effect before the next step, and a sampled call gives the same tokens
however the threads are timed (batching/loop_driver.py)."""

from __future__ import annotations

import threading
import time

import torch
from transformers import StoppingCriteria

import hf_paged
from tests.bounded import bounded
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


class StopOnMultipleOfFive(StoppingCriteria):
    """A row is done once its last token is a multiple of 5 (the caller's criterion: replayed between steps)."""

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] % 5 == 0


def _generate(model, ids, mask):
    torch.manual_seed(7)
    return model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=True, num_return_sequences=2,
                          stopping_criteria=[StopOnMultipleOfFive()], pad_token_id=0)


def test_a_call_arriving_during_the_loop_threads_turn_steps_in_its_own_thread():
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts([6, 11, 3], seed=4))
    hf_paged.wrap(model, block_size=4, max_num_batched_tokens=64)
    try:
        engine = hf_paged.engine_of(model)
        expected = _generate(model, ids, mask)  # nobody else holds a turn
        steppers: set[int] = set()
        engine.add_step_listener(lambda step: steppers.add(threading.get_ident()))
        entered, gate = threading.Event(), threading.Event()

        def the_loop_threads_turn():
            entered.set()
            gate.wait(120)

        loop = engine.loop
        loop._command(the_loop_threads_turn)  # wakes the loop thread: this runs in its turn
        assert entered.wait(120)

        def end_the_turn_once_the_caller_arrived():  # (it waits for the turn's end, or, before, queued its requests)
            deadline = time.monotonic() + 120
            while not (loop._driver.callers_waiting or loop.num_waiting) and time.monotonic() < deadline:
                time.sleep(0.001)
            gate.set()

        threading.Thread(target=end_the_turn_once_the_caller_arrived, daemon=True).start()
        got = bounded(lambda: (threading.get_ident(), _generate(model, ids, mask)), 120)
        assert steppers == {got[0]}  # every step of the call ran in the caller's thread, none in the loop thread's
        assert torch.equal(got[1], expected)
    finally:
        hf_paged.unwrap(model)
