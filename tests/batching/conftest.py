"""Fixtures shared by the batching tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run the test with one torch thread (the lean forward's pruning and sliced head run only there)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def kernels_ready():
    """The plain CPU attention kernel loaded before the test's engines step: two engines compared bit for bit must
    take the same attention path at every step, and the torch path serves until the kernel is ready (the engine
    switches between steps; the two paths are equal in tokens, not always in bits: they differed on an AVX-512 Xeon,
    where a test's first engine ran on the torch path and its second on the kernel)."""
    from hf_paged.cache.kernels import cpu_warm

    cpu_warm.prepare([cpu_warm.PLAIN])
    assert cpu_warm.wait([cpu_warm.PLAIN], timeout=600), "the CPU attention kernel did not load"  # a first compile: minutes
