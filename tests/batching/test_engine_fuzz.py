"""The engine under seeded random operations (`engine_fuzz.py`): 300 seeds ran clean after the fixes of the h53
pass (forks of a 1-token last chunk, pool failures of the wrong request, forks of refused requests); a few seeds per
model here keep them so (~1-2 s each)."""

from __future__ import annotations

import pytest

from tests.batching.engine_fuzz import Stock, make_model, run_seed


@pytest.fixture(scope="module")
def models():
    built = {name: make_model(name) for name in ("llama", "qwen2")}
    return {name: (model, Stock(model)) for name, model in built.items()}


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1, 113, 171, 234])  # 113, 171, 234: the seeds that found the h53 defects
def test_random_operations_keep_the_engine_exact_and_whole(models, name, seed):
    assert run_seed(seed, name, models) == []
