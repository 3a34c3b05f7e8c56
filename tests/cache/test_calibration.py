"""Retrieval-head calibration: far-attention mass per KV head, head choice, and the model driver."""

import pytest
import torch

from hf_paged import PagedConfig
from hf_paged.cache.compression.calibration import calibrate_retrieval_heads, choose_heads, retrieval_scores
from tests.tiny_models import ragged_prompts, tiny_model


def test_far_mass_counts_keys_past_the_window_and_the_sinks():
    # 1 layer, 4 query heads over 2 KV heads, 2 queries (positions 8, 9) over 10 keys.
    attn = torch.zeros(1, 4, 2, 10)
    attn[0, 0, :, 1] = 1.0  # head 0 (KV head 0): all on key 1, a sink -> 0
    attn[0, 1, :, 3] = 1.0  # head 1 (KV head 0): key 3, far from 8 and 9 (window 4) -> 1
    attn[0, 2, 0, 4] = 1.0  # head 2 (KV head 1): query 8 -> key 4: inside its window (8 - 4 = 4) -> 0
    attn[0, 2, 1, 4] = 1.0  # query 9 -> key 4: far -> 1
    attn[0, 3, :, 9] = 1.0  # head 3: recent -> 0
    scores = retrieval_scores([attn], 2, window=4, num_sink_tokens=2, num_queries=2)
    assert scores.tolist() == [[0.5, 0.25]]


def test_choose_heads_takes_the_top_fraction_across_layers():
    scores = torch.tensor([[0.1, 0.9], [0.5, 0.2], [0.0, 0.3]])
    assert choose_heads(scores, 0.34) == ((1,), (0,), ())
    assert choose_heads(scores, 0.01) == ((1,), (), ())
    with pytest.raises(ValueError, match="fraction must be in"):
        choose_heads(scores, 0.0)


def test_calibration_on_a_model_restores_its_attention_and_feeds_the_config():
    model = tiny_model("llama")  # 2 layers x 2 KV heads
    result = calibrate_retrieval_heads(model, ragged_prompts([40, 50], seed=1), fraction=0.5, window=8,
                                       num_sink_tokens=2, num_queries=8)
    assert model.config._attn_implementation == "sdpa"
    assert result.scores.shape == (2, 2) and bool((result.scores > 0).all())
    assert sum(len(layer) for layer in result.full_precision_heads) == 2
    config = PagedConfig(kv_cache_dtype="int4", kv_full_precision_heads=result.full_precision_heads)
    assert config.kv_full_precision_heads == result.full_precision_heads
