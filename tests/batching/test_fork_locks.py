"""A process forked while another thread of the parent holds one of hf_paged's locks (a thread creating an engine,
reserving a request id, or loading the CPU kernels, while a DataLoader or multiprocessing pool forks its workers):
the child's first use of that lock returns instead of waiting for ever on a thread that does not exist there."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the parent's end of both scripts: let the holder go, then wait for the child, bounded (a hung child is killed)
_WAIT_FOR_CHILD = """
release.set()
deadline = time.monotonic() + 120
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("CHILD EXIT", os.waitstatus_to_exitcode(status))
        break
    if time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print("CHILD HUNG")
        break
    time.sleep(0.05)
"""


# Each case in its own process (what a test run's other threads hold must not be forked with it): a thread holds
# the lock, the main thread forks, the child uses what the lock guards and exits 0; the parent waits at most 120 s.
_SCRIPT = """
import os, signal, sys, threading, time, torch, hf_paged
from tests.tiny_models import tiny_model
torch.set_num_threads(1)
which = sys.argv[1]
model = hf_paged.wrap(tiny_model("llama"))
from hf_paged.cache.kernels import cpu_warm
if which == "engine_lock":  # a thread building another model's engine
    from hf_paged.api import wrap_state
    lock = wrap_state._ENGINE_LOCK
    use = lambda: hf_paged.engine_of(model)
elif which == "request_ids":  # a thread reserving a request id
    lock = hf_paged.engine_of(model)._ids.lock
    use = lambda: model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, do_sample=False)
elif which == "cpu_warm_lock":  # the kernel loader marking a variant ready
    lock = cpu_warm._lock
    use = lambda: cpu_warm.prepare([cpu_warm.variant_of(*cpu_warm.formats_for("int8", "int8"))])
elif which == "cpu_warm_loading":  # the kernel loader's thread is mid-load: its variant's event never set here
    lock, loading, original = None, threading.Event(), cpu_warm._load
    def slow_load(variants):
        loading.set()
        time.sleep(3)
        original(variants)
    cpu_warm._load = slow_load
    variant = cpu_warm.variant_of(*cpu_warm.formats_for("int8", "int8"))
    cpu_warm.prepare([variant])
    assert loading.wait(30)
    def use():  # the load starts again here (a stand-in loader: a real one may compile for minutes on a busy CPU)
        cpu_warm._load = lambda variants: [cpu_warm._started[v].set() for v in variants]
        os.environ["HF_PAGED_JIT"] = "now"  # (prepare waits for the load's end)
        cpu_warm.prepare([variant])
        assert cpu_warm._started[variant].is_set()
elif which == "parallel_kernels":  # no lock: the parent ran numba's parallel kernels (GNU OpenMP) before
    lock = None
    assert cpu_warm.wait([cpu_warm.PLAIN], timeout=240)  # (a first compile on a busy CPU takes minutes)
    torch.set_num_threads(2)
    use = lambda: model.generate(torch.tensor([[3, 4, 5], [6, 7, 8]]), max_new_tokens=2, do_sample=False)
    use()
    probe = os.fork()  # stock torch first: on some CPUs (MKL on AMD, GNU OpenMP) its own matmul hangs in the child
    if probe == 0:
        torch.randn(6, 32) @ torch.randn(32, 96)
        os._exit(0)
    deadline = time.monotonic() + 30
    while not os.waitpid(probe, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(probe, signal.SIGKILL)
            os.waitpid(probe, 0)
            print("PLATFORM HANG", flush=True)
            sys.exit(0)
        time.sleep(0.05)
held, release = threading.Event(), threading.Event()
def hold():
    with lock:
        held.set()
        release.wait(60)
if lock is not None:
    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(30)
pid = os.fork()
if pid == 0:
    try:
        use()
    except BaseException as exc:
        print("CHILD FAILED", type(exc).__name__, exc, flush=True)
        os._exit(3)
    os._exit(0)
""" + _WAIT_FOR_CHILD


CASES = ["engine_lock", "request_ids", "cpu_warm_lock", "cpu_warm_loading", "parallel_kernels"]


@pytest.fixture(scope="module")
def case_outputs(tmp_path_factory):
    """Every case's process started at once (each is its own process either way, and most of each is importing
    torch: on 2 cores together they take about half the time of one after the other); (stdout, stderr) by case,
    written to files (no pipe fills while another case is waited for)."""
    root, logs = Path(__file__).resolve().parents[2], tmp_path_factory.mktemp("fork_locks")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    procs = {}
    try:
        for which in CASES:
            with open(logs / f"{which}.out", "w") as out, open(logs / f"{which}.err", "w") as err:
                procs[which] = subprocess.Popen([sys.executable, "-c", _SCRIPT, which], cwd=root, stdout=out,
                                                stderr=err, env=env)
        deadline = time.monotonic() + 480
        for proc in procs.values():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {which: ((logs / f"{which}.out").read_text(), (logs / f"{which}.err").read_text()) for which in CASES}


@pytest.mark.parametrize("which", CASES)
def test_a_child_forked_while_a_thread_holds_a_lock_uses_it(which, case_outputs):
    stdout, stderr = case_outputs[which]
    if "PLATFORM HANG" in stdout:  # (seen on an AMD EPYC with AVX2 only: torch 2.13's MKL sgemm in GNU OpenMP)
        pytest.skip("this platform's torch hangs a forked child at its first matmul once the parent ran one on two "
                    "threads (GNU OpenMP): stock fails the same way, nothing here to test")
    assert "CHILD EXIT 0" in stdout, (stdout[-2000:], stderr[-3000:])


# Every module-level lock in hf_paged (`_NAME = threading.Lock()` at a line's start), found in the sources so that a
# new one is covered too; wrap_state and cpu_warm renew theirs with their own hooks (the cases above).
_OWN_HOOKS = {("hf_paged.api.wrap_state", "_ENGINE_LOCK"), ("hf_paged.cache.kernels.cpu_warm", "_lock")}


def _module_locks() -> list[tuple[str, str]]:
    import re

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted((root / "hf_paged").rglob("*.py")):
        for name in re.findall(r"^(\w+) = threading\.R?Lock\(\)", path.read_text(), re.MULTILINE):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            if (module, name) not in _OWN_HOOKS:
                found.append((module, name))
    return found


_HOLD_ALL = """
import importlib, os, signal, sys, threading, time
locks = [tuple(item.split(":")) for item in sys.argv[1:]]
modules = {name: importlib.import_module(name) for name, _ in locks}
held, release = threading.Event(), threading.Event()
def hold():  # one thread holds every lock (a compile, a healing, a head build mid-way) while the main thread forks
    taken = [getattr(modules[m], n) for m, n in locks]
    for lock in taken:
        lock.acquire()
    held.set()
    release.wait(60)
    for lock in taken:
        lock.release()
threading.Thread(target=hold, daemon=True).start()
assert held.wait(30)
pid = os.fork()
if pid == 0:  # each module's next `with _LOCK:` (the lock looked up by name, as the modules do)
    stuck = []
    for m, n in locks:
        lock = getattr(modules[m], n)
        if lock.acquire(timeout=5):
            lock.release()
        else:
            stuck.append(f"{m}.{n}")
    print("CHILD STUCK ON", stuck, flush=True)
    # and one real use: the process-wide index cache (its lock guards its creation)
    from hf_paged.processors.index.index_cache import default_index_cache
    default_index_cache()
    os._exit(1 if stuck else 0)
""" + _WAIT_FOR_CHILD


def test_module_level_locks_are_fresh_in_a_forked_child():
    locks = _module_locks()
    assert ("hf_paged.programs.healing", "_TEXTS_LOCK") in locks and len(locks) >= 14, locks  # the scan works
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _HOLD_ALL, *(f"{m}:{n}" for m, n in locks)], cwd=root,
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)})
    assert "CHILD EXIT 0" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])
