"""Test-wide setup: the Triton interpreter on machines without CUDA (set before any kernel is defined), and
deterministic property tests."""

import os

import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(torch.get_num_threads(), 2))

# Property tests draw the same examples on every run (seeded from each test's code), so a red run is a bug that
# reproduces, never a new random draw; no deadline and no speed health check (a loaded machine is slow, not
# wrong); no example database (a run does not depend on what an earlier one left in .hypothesis/). To explore
# fresh random examples locally: HYPOTHESIS_PROFILE=explore python -m pytest ...
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
