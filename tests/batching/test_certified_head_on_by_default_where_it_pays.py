"""`PagedConfig.certified_argmax=None` (the default) turns the certified greedy head on where it pays: a plain fp32
CPU head of >= 2M weights and >= 128 wide, on a CPU with native bf16 products; off for small heads, off when False.
(The CPU's bf16 support is stubbed: what is checked is the decision, not the speed.)"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig
from hf_paged.batching import certified_head
from tests.tiny_models import tiny_model


def _wide_head_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=2**14, max_position_embeddings=256)  # a 2M-weight head
    return LlamaForCausalLM(config).eval()


def test_the_default_takes_the_certified_head_for_a_large_head_on_a_bf16_cpu(monkeypatch):
    monkeypatch.setattr(certified_head, "bf16_products_native", lambda: True)
    model = _wide_head_model()
    assert Engine(model, PagedConfig(block_size=8)).runner.certified is not None
    assert Engine(model, PagedConfig(block_size=8, certified_argmax=False)).runner.certified is None
    assert Engine(tiny_model("llama"), PagedConfig(block_size=8)).runner.certified is None  # a small head


def test_the_default_leaves_it_off_without_native_bf16(monkeypatch):
    monkeypatch.setattr(certified_head, "bf16_products_native", lambda: False)
    model = _wide_head_model()
    assert Engine(model, PagedConfig(block_size=8)).runner.certified is None
    assert Engine(model, PagedConfig(block_size=8, certified_argmax=True)).runner.certified is not None
