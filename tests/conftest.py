"""Test-wide setup: the Triton interpreter on machines without CUDA (set before any kernel is defined),
deterministic property tests, lm-eval's bundled task index built once per session, and the processors' kernels
loaded from the session's start."""

import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A crash of this process prints its Python stacks (pytest's faulthandler): Ray's driver, which the Ray modules start
# in this process (tests/ray_cluster.py), would replace that SIGSEGV handler with its own, writing to its log, which
# `ray.shutdown()` closes: a later segfault then said nothing ("Segmentation fault" alone, CI of 8eddab7)
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

torch.set_num_threads(min(torch.get_num_threads(), 2))

# Property tests draw the same examples on every run (seeded from each test's code), so a red run is a bug that
# reproduces, never a new random draw; no deadline and no speed health check (a loaded machine is slow, not
# wrong); no example database (a run does not depend on what an earlier one left in .hypothesis/). To explore
# fresh random examples locally: HYPOTHESIS_PROFILE=explore python -m pytest ...
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(scope="session", autouse=True)
def _lm_eval_bundled_tasks_indexed_once():
    """lm-eval's bundled task index built once per session, not once per `TaskManager` (tests/lm_eval_index.py):
    ~8-13 s saved per later build. Only where a collected test module imported lm-eval (a run without it pays
    nothing)."""
    if "lm_eval" not in sys.modules:
        yield
        return
    from lm_eval.tasks._index import TaskIndex

    from tests.lm_eval_index import build_bundled_once

    undo = build_bundled_once(TaskIndex)
    yield
    undo()


@pytest.fixture
def one_thread():
    """Run the test with one torch thread: the lean forward's pruning and sliced head run only there, and the CPU
    attention kernels run serial (their parallel variant, a second and slower numba compile, is tested where a test
    asks for threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_JIT_START = {"wanted": False, "started": False}


def pytest_collection_finish(session):
    """The processors' tests wait for their compiled kernels (`jit.wait`): note whether this session has any."""
    _JIT_START["wanted"] = any(item.nodeid.startswith("tests/processors/") for item in session.items)


def pytest_runtest_setup(item):
    """Start loading the processors' compiled kernels (`hf_paged.processors.jit`) early where the session has
    processors tests: on a cold numba cache (CI's fresh checkout) the compile child (nice 10) then runs beside the
    tests that come first, instead of the first processors test waiting ~75 s for it. Not before the plain CPU
    attention kernel is loaded, which the engine tests wait for (`kernels_ready`): compiles take one lock per cache,
    one at a time. A warm cache loads in about a second, as any large vocabulary's first processor loads it; the
    kernels and their Python twins give the same results (tests/processors/test_automaton.py)."""
    if not _JIT_START["wanted"] or _JIT_START["started"]:
        return
    cpu_warm = sys.modules.get("hf_paged.cache.kernels.cpu_warm")
    plain_loaded = cpu_warm is not None and cpu_warm.PLAIN in cpu_warm.ready_variants()
    if plain_loaded or item.nodeid.startswith("tests/processors/"):
        from hf_paged.processors import jit

        _JIT_START["started"] = True
        jit.start()
