"""One engine loop, many callers: threads and asyncio tasks share the engine's steps."""

import asyncio
import os
import threading
import time

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor

import hf_paged
from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.batching.engine_loop import LoopClosedError
from tests.bounded import bounded
from tests.tiny_models import left_pad, ragged_prompts, stock_greedy, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _run_threads(targets):
    errors, threads = [], []
    start = threading.Barrier(len(targets))

    def wrap(fn):
        def run():
            try:
                start.wait()
                fn()
            except BaseException as exc:  # noqa: BLE001 -- reported by the test
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


def test_threads_calling_generate_get_stock_rows_and_share_steps(model):
    groups = [ragged_prompts([5, 17], seed=1), ragged_prompts([9, 3, 12], seed=2), ragged_prompts([20], seed=3)]
    expected = [stock_greedy(model, prompts, 24) for prompts in groups]
    hf_paged.wrap(model, block_size=4, max_num_batched_tokens=64)
    engine = hf_paged.engine_of(model)
    steps: list[set[str]] = []
    engine.add_step_listener(lambda step: steps.append(set(step.new_tokens)))
    results: dict[int, torch.Tensor] = {}

    def caller(k):
        def run():
            ids, mask = left_pad(groups[k])
            results[k] = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)[:, ids.shape[1]:]
        return run

    try:
        _run_threads([caller(k) for k in range(len(groups))])
        for k, prompts in enumerate(groups):
            for row, want in enumerate(expected[k]):
                got = results[k][row].tolist()
                assert got[: len(want)] == want
        # the callers' requests ran together: some step produced tokens for rows of at least two callers
        assert max(len(ids) for ids in steps) > max(len(g) for g in groups)
        engine.check_integrity()
        assert engine.cache.pool.num_used_blocks == 0 and not engine.requests
    finally:
        hf_paged.unwrap(model)


def test_threads_calling_generate_batch_keep_their_own_ids(model):
    groups = [ragged_prompts([4, 8], seed=4), ragged_prompts([6, 2, 7], seed=5)]
    expected = [stock_greedy(model, prompts, 10) for prompts in groups]
    hf_paged.wrap(model)
    results = {}

    def caller(k):
        def run():
            results[k] = model.generate_batch(groups[k], GenerationConfig(max_new_tokens=10, do_sample=False))
        return run

    try:
        _run_threads([caller(0), caller(1), caller(0), caller(1)])
        for k in range(2):
            outs = results[k]
            assert list(outs) == [f"req_{i}" for i in range(len(groups[k]))]
            assert [o.request_id for o in outs.values()] == list(outs)
            assert [o.generated_tokens for o in outs.values()] == expected[k]
        hf_paged.engine_of(model).check_integrity()
    finally:
        hf_paged.unwrap(model)


def test_request_ids_unique_and_duplicates_refused(model):
    engine = Engine(model, PagedConfig(block_size=4))
    try:
        auto = [engine.loop.submit([[3, 4]], [SamplingParams(max_new_tokens=2)]) for _ in range(5)]
        assert len({s.request_ids[0] for s in auto}) == 5
        given = engine.loop.submit([[3, 4]], [SamplingParams(max_new_tokens=30)], request_ids=["mine"])
        with pytest.raises(ValueError, match="contains '__child#'"):  # a fork's id: the engine failed at its run
            engine.loop.submit([[5]], [SamplingParams(max_new_tokens=2)], request_ids=["x__child#0"])
        with pytest.raises(ValueError, match="'mine' is already in use"):
            engine.loop.submit([[5]], [SamplingParams(max_new_tokens=2)], request_ids=["mine"])
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request([5], request_id="mine")
        assert given.result()["mine"].status is RequestStatus.FINISHED
        assert all(s.result()[s.request_ids[0]].status is RequestStatus.FINISHED for s in auto)
        engine.loop.submit([[5]], [SamplingParams(max_new_tokens=2)], request_ids=["mine"]).result()  # free again
    finally:
        engine.loop.shutdown()


class Exploding(LogitsProcessor):
    def __call__(self, input_ids, scores):
        raise RuntimeError("boom")


def test_a_failing_request_fails_alone_and_the_loop_goes_on(model):
    engine = Engine(model, PagedConfig(block_size=4))
    try:
        sub = engine.loop.submit(
            [[3, 4, 5], [6, 7, 8], []],
            [SamplingParams(max_new_tokens=6), SamplingParams(max_new_tokens=6, logits_processors=[Exploding()]),
             SamplingParams(max_new_tokens=6)],
        )
        good, bad, empty = sub.result().values()
        assert good.status is RequestStatus.FINISHED and len(good.generated_tokens) == 6
        assert bad.status is RequestStatus.FAILED and "boom" in bad.error
        assert empty.status is RequestStatus.FAILED and "empty prompt" in empty.error
        again = engine.loop.submit([[3, 4, 5]], [SamplingParams(max_new_tokens=6)]).result()
        assert next(iter(again.values())).generated_tokens == good.generated_tokens
        engine.check_integrity()
    finally:
        engine.loop.shutdown()


def test_a_request_the_engine_refuses_outright_fails_alone(model, monkeypatch):
    engine = Engine(model, PagedConfig(block_size=4))
    real = engine._add

    def picky(request_id, prompt_ids, *args):
        if list(prompt_ids) == [9, 9]:
            raise RuntimeError("cannot add this one")
        return real(request_id, prompt_ids, *args)

    monkeypatch.setattr(engine, "_add", picky)
    try:
        outs = engine.loop.submit([[9, 9], [3, 4]], [SamplingParams(max_new_tokens=3, num_return_sequences=2),
                                                     SamplingParams(max_new_tokens=3)]).result()
        statuses = [o.status for o in outs.values()]
        assert statuses == [RequestStatus.FAILED, RequestStatus.FAILED, RequestStatus.FINISHED]
        assert "cannot add this one" in next(iter(outs.values())).error
        engine.check_integrity()
        assert not engine.requests and not engine._reserved_ids
    finally:
        engine.loop.shutdown()


def test_a_failing_step_fails_its_requests_not_the_loop(model, monkeypatch):
    engine = Engine(model, PagedConfig(block_size=4))
    real = engine.scheduler.schedule
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("scheduler exploded")
        return real()

    monkeypatch.setattr(engine.scheduler, "schedule", flaky)
    try:
        out = next(iter(engine.loop.submit([[3, 4, 5]], [SamplingParams(max_new_tokens=6)]).result().values()))
        assert out.status is RequestStatus.FAILED and "scheduler exploded" in out.error
        out = next(iter(engine.loop.submit([[3, 4, 5]], [SamplingParams(max_new_tokens=6)]).result().values()))
        assert out.status is RequestStatus.FINISHED
        engine.check_integrity()
        assert engine.cache.pool.num_used_blocks == 0
    finally:
        engine.loop.shutdown()


def test_async_stream_and_cancel_frees_blocks(model):
    engine = Engine(model, PagedConfig(block_size=4, enable_prefix_caching=False))
    want = stock_greedy(model, [[3, 4, 5, 6]], 12)[0]

    async def main():
        tokens = []
        async for delta in engine.loop.generate_async([3, 4, 5, 6], SamplingParams(max_new_tokens=12)):
            tokens.extend(delta.new_token_ids)
            if delta.finished:
                assert delta.output.generated_tokens == tokens
        assert tokens == want

        started = asyncio.Event()

        async def consume():
            async for _ in engine.loop.generate_async(list(range(3, 40)), SamplingParams(max_new_tokens=400)):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        assert engine.cache.pool.num_used_blocks > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        steps_at_cancel = engine.metrics.num_steps
        for _ in range(200):  # the abort runs before the loop's next step
            if engine.cache.pool.num_used_blocks == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.cache.pool.num_used_blocks == 0
        assert engine.metrics.num_steps <= steps_at_cancel + 1
        assert engine.stats()["requests_aborted"] == 1

    try:
        asyncio.run(main())
        engine.check_integrity()
        assert not engine.requests
    finally:
        engine.loop.shutdown()


def test_idle_loop_sleeps(model):
    """The idle loop thread waits on a condition: it burns no CPU. Counted on that thread's own clock, not the
    process's (a background kernel load or index compile left by an earlier test would count there)."""
    engine = Engine(model, PagedConfig(block_size=4))
    try:
        engine.loop.submit([[3, 4, 5]], [SamplingParams(max_new_tokens=4)]).result()
        clock = time.pthread_getcpuclockid(engine.loop._thread.ident)
        time.sleep(0.05)  # (the thread's last bookkeeping after the result: counted either way, well under 0.05 s)
        cpu = time.clock_gettime(clock)
        time.sleep(0.5)
        assert engine.loop._thread.is_alive()
        assert time.clock_gettime(clock) - cpu < 0.05  # a spinning loop would spend about 0.5 s
    finally:
        engine.loop.shutdown()


def test_shutdown_aborts_in_flight_and_refuses_new_requests(model):
    engine = Engine(model, PagedConfig(block_size=4))
    sub = engine.loop.submit([list(range(3, 30))], [SamplingParams(max_new_tokens=400)])
    engine.loop.shutdown(timeout=0.0)
    out = next(iter(sub.result().values()))
    assert out.status is RequestStatus.FAILED and out.finish_reason == "abort"
    with pytest.raises(LoopClosedError):
        engine.loop.submit([[3]], [SamplingParams()])
    assert engine.cache.pool.num_used_blocks == 0
    engine.check_integrity()
    assert engine.run([engine.add_request([3, 4], SamplingParams(max_new_tokens=3))])  # still usable directly


def test_unwrap_stops_the_loop_thread(model):
    hf_paged.wrap(model)
    ids, mask = left_pad(ragged_prompts([5]))
    model.generate(ids, attention_mask=mask, max_new_tokens=3)
    thread = hf_paged.engine_of(model).loop._thread
    assert thread.is_alive()
    hf_paged.unwrap(model)
    assert not thread.is_alive()


def test_ttft_counts_from_submission(model):
    engine = Engine(model, PagedConfig(block_size=4))
    rid = engine.reserve_request_id()
    engine.add_reserved_request(rid, [3, 4, 5], SamplingParams(max_new_tokens=2), arrival_time=time.perf_counter() - 5)
    engine.run([rid])
    assert engine.stats()["ttft_p50_s"] >= 5  # the caller's wait before the engine saw the request counts


def test_a_thread_of_the_callers_choice_can_be_the_loop_thread(model):
    engine = Engine(model, PagedConfig(block_size=4))
    ready = threading.Event()
    thread = threading.Thread(target=engine.loop.run_in_this_thread, kwargs={"on_ready": ready.set})
    thread.start()
    assert ready.wait(10) and engine.loop._thread is thread
    with pytest.raises(RuntimeError, match="already has a thread"):
        engine.loop.run_in_this_thread()

    async def stream():
        return [d async for d in engine.loop.generate_async([3, 4, 5], SamplingParams(max_new_tokens=4))]

    deltas = asyncio.run(stream())
    assert deltas[-1].finished and len(deltas[-1].output.generated_tokens) == 4
    engine.loop.shutdown()
    thread.join(10)
    assert not thread.is_alive()


def test_a_dropped_wrapped_model_is_collected_and_its_loop_thread_ends():
    """The loop thread held its loop, engine, model and KV pool for ever: a notebook cell that wrapped a model again
    and again kept every copy alive. Idle, it now holds the loop weakly."""
    import gc
    import weakref

    model = hf_paged.wrap(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=32))
    model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=3)  # through the loop thread
    engine = hf_paged.engine_of(model)
    thread, gone = engine.loop._thread, weakref.ref(engine)
    assert thread is not None and thread.is_alive()
    del model, engine
    deadline = time.monotonic() + 30
    while gone() is not None and time.monotonic() < deadline:  # (a turn may still hold it for a moment)
        gc.collect()
        time.sleep(0.05)
    assert gone() is None
    thread.join(timeout=30)
    assert not thread.is_alive()


def _bounded(fn, seconds: float = 120):
    return bounded(fn, seconds, "a deadlock")


def test_generate_from_inside_a_step_of_the_same_model_raises_instead_of_hanging():
    """A logits processor (or criterion, or streamer) that calls generate on the same wrapped model waited for the
    step it was called from: for ever."""
    model = hf_paged.wrap(tiny_model("llama"))
    prompt = torch.tensor([ragged_prompts([6], seed=2)[0]])

    class Nested(LogitsProcessor):
        def __call__(self, input_ids, scores):
            model.generate(prompt, max_new_tokens=2, do_sample=False)
            return scores

    with pytest.raises(hf_paged.errors.UnsupportedGenerationError, match="inside a step"):
        _bounded(lambda: model.generate(prompt, max_new_tokens=3, do_sample=False, logits_processor=[Nested()]))
    expected = stock_greedy(model, prompt.tolist(), 3)[0]
    assert _bounded(lambda: model.generate(prompt, max_new_tokens=3, do_sample=False))[0, 6:].tolist() == expected


_FORK_SCRIPT = """
import multiprocessing as mp, threading, torch, hf_paged
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model
torch.set_num_threads(1)  # (libgomp's pool is not fork-safe: a forked child runs one torch thread, as here)
model = hf_paged.wrap(tiny_model("llama"))
prompts = ragged_prompts([7, 9], seed=4)
expected = [stock_greedy(model, prompts[:1], 12)[0][-4:], stock_greedy(model, prompts[1:], 40)[0][-4:]]
model.generate(torch.tensor([prompts[0]]), max_new_tokens=2, do_sample=False)  # starts the parent's loop thread
class Started:  # a streamer that says when the first caller's generate is under way (it drives the steps)
    def __init__(self):
        self.event = threading.Event()
    def put(self, value):
        self.event.set()
    def end(self):
        pass
def child(results):
    got, started = {}, Started()
    def one(i, n, streamer=None):
        got[i] = model.generate(torch.tensor([prompts[i]]), max_new_tokens=n, do_sample=False,
                                streamer=streamer)[0, -4:].tolist()
    first = threading.Thread(target=one, args=(0, 12, started), daemon=True)
    first.start()
    started.event.wait(30)
    second = threading.Thread(target=one, args=(1, 40), daemon=True)  # outlives the driver: the loop thread's
    second.start()
    first.join(60)
    second.join(60)
    results.put([got.get(0), got.get(1)])
context = mp.get_context("fork")
results = context.Queue()
process = context.Process(target=child, args=(results,))
process.start()
got = results.get(timeout=90)
process.join(10)
print("EQUAL" if got == expected else f"DIFFERENT {got} {expected}")
"""


def test_a_forked_child_starts_its_own_loop_thread():
    """After `os.fork` (gunicorn --preload, multiprocessing's fork) the parent's loop thread does not exist in the
    child, yet the loop still named it: two threads generating at once in the child, one never returned. (Its own
    process: what a test run's other threads hold must not be forked with it.)"""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], cwd=root, capture_output=True, text=True, check=False,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)})
    assert done.returncode == 0 and "EQUAL" in done.stdout, (done.stdout[-2000:], done.stderr[-4000:])
