"""`benchmarks/constraint_modes.py` measures the sampler the engine really calls.

The script times the engine's sampler and reads its mask counters by giving the engine a `TimedSampler`. After the
engine split (a8dfece) the step's `StepSampling` kept the sampler it was built with, so the script's sampler sat idle:
its table read 0.00 masks per token in mask mode (the docstring's 1.00) and 0 us of sampler time on every row.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_jit(monkeypatch: pytest.MonkeyPatch) -> None:
    # `benchmarks/common.py` sets HF_PAGED_JIT=now for the whole process when imported: here for this test only
    monkeypatch.setenv("HF_PAGED_JIT", os.environ.get("HF_PAGED_JIT", "off"))


def test_mask_mode_counts_a_mask_per_constrained_token_in_the_timed_sampler() -> None:
    import torch

    from benchmarks import constraint_modes
    from hf_paged.api.models import default_model

    torch.set_num_threads(1)
    model, tok = default_model()
    run = constraint_modes.run_once(model, tok, constraint_modes.CONSTRAINTS["lines"], "mask", False, 2)
    assert run.num_tokens > 0 and run.constrained_tokens > 0
    assert run.masks == run.constrained_tokens  # mask mode: one mask per constrained token
    assert run.sampler_s > 0  # the timed sampler is the one the steps call
