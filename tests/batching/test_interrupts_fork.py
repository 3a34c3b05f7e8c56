"""A process forked while another thread generates (a web app's worker thread, then a DataLoader or multiprocessing
pool starting its workers): the child's generate equals stock and returns; the parent's request is unharmed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import multiprocessing as mp, threading, torch, hf_paged
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model
torch.set_num_threads(1)
model = hf_paged.wrap(tiny_model("llama"))
mine, other = ragged_prompts([7, 30], seed=4)
want_mine, want_other = stock_greedy(model, [mine], 12)[0], stock_greedy(model, [other], 300)[0]
engine = hf_paged.engine_of(model)
armed, in_step, release = threading.Event(), threading.Event(), threading.Event()
def hold_the_step(step):  # (a step listener runs inside the step, under the engine's lock)
    if armed.is_set():
        armed.clear()
        in_step.set()
        release.wait(2)  # the fork below waits for this step's end: 2 s, then the step ends
engine.add_step_listener(hold_the_step)
box = {}
def other_caller():  # steps for its own request all along
    box["other"] = model.generate(torch.tensor([other]), max_new_tokens=300, do_sample=False)[0, 30:].tolist()
thread = threading.Thread(target=other_caller, daemon=True)
def child(results):
    results.put(model.generate(torch.tensor([mine]), max_new_tokens=12, do_sample=False)[0, 7:].tolist())
context = mp.get_context("fork")
got = []
thread.start()
for _ in range(3):  # each fork starts inside a step of the other thread
    in_step.clear()
    release.clear()
    armed.set()
    in_step.wait(30)
    results = context.Queue()
    process = context.Process(target=child, args=(results,))
    process.start()
    release.set()
    try:
        got.append(results.get(timeout=60))
    except Exception as exc:
        got.append(f"no answer: {type(exc).__name__}")
    process.join(10)
    if process.is_alive():
        process.kill()
thread.join(120)
print("CHILD", "EQUAL" if got == [want_mine] * 3 else f"DIFFERENT {got} {want_mine}")
print("PARENT", "EQUAL" if box.get("other") == want_other else "DIFFERENT")
stats = engine.stats()
print("IDLE", stats["blocks_used"] == 0 and stats["requests_running"] == 0 and not engine.requests)
"""


def test_a_child_forked_while_another_thread_generates_can_generate():
    """The child's engine lock was held by the parent's stepping thread, which does not exist in the child: its
    generate waited for ever. Now a fork waits for the step's end, and the child drops the parent's
    requests. (Its own process: what a test run's other threads hold must not be forked with it.)"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=root, capture_output=True, text=True, check=False,
                          timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-4000:]
    assert "CHILD EQUAL" in done.stdout and "PARENT EQUAL" in done.stdout and "IDLE True" in done.stdout, \
        (done.stdout[-2000:], done.stderr[-2000:])
