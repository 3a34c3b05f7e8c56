"""Fixtures shared by the batching tests."""

from __future__ import annotations

import signal
import threading

import pytest


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Python's own Ctrl-C handler while a test runs. A runner started with SIGINT ignored (a background job of a
    non-interactive shell: `nohup python -m pytest &`) hands Python SIG_IGN, and Python then installs no handler:
    `signal.raise_signal(SIGINT)` and `_thread.interrupt_main()` do nothing, and the Ctrl-C tests failed in such a run
    (they pass in a foreground one)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def kernels_ready():
    """The plain CPU attention kernel loaded before the test's engines step: two engines compared bit for bit must
    take the same attention path at every step, and the torch path serves until the kernel is ready (the engine
    switches between steps; the two paths are equal in tokens, not always in bits: they differed on an AVX-512 Xeon,
    where a test's first engine ran on the torch path and its second on the kernel)."""
    from hf_paged.cache.kernels import cpu_warm

    cpu_warm.prepare([cpu_warm.PLAIN])
    assert cpu_warm.wait([cpu_warm.PLAIN], timeout=600), "the CPU attention kernel did not load"  # a first compile: minutes
