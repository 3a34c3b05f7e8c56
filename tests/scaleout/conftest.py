"""Shared by the scale-out tests: the torch thread count each test module found is given back after it.

An `EngineReplica(ReplicaSpec(torch_threads=1))` or a sharing engine built in the test process calls
`torch.set_num_threads(1)` (right in a replica, which owns its process); without this every later test of the
session ran on one thread, and which tests did depended on the order the tests ran in. Per module, not per test: a
module's in-process replica keeps the setting it chose while the module's tests use it.
"""

from __future__ import annotations

import pytest
import torch

THREADS = torch.get_num_threads()  # as tests/conftest.py left it


@pytest.fixture(scope="module", autouse=True)
def _torch_threads_restored():
    yield
    torch.set_num_threads(THREADS)
