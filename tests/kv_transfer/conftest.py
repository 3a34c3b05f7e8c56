"""The KV-transfer tests' shared model, prompts (a shared system prompt, then two questions) and stock outputs."""

from __future__ import annotations

import pytest

from tests.kv_transfer.test_engine_transfer import MAX_NEW
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def prompts():
    system = ragged_prompts([45], seed=21)[0]  # 5 full blocks of 8 shared, then a partial one
    return [system + q for q in ragged_prompts([3, 11], seed=22)]


@pytest.fixture(scope="module")
def expected(model, prompts):
    return stock_greedy(model, prompts, MAX_NEW)
