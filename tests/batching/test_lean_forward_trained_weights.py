"""The lean forward on weights a trained checkpoint has: norm weights other than one and biases other than zero.

A freshly built model's RMSNorm weights are all ones and its projection biases all zeros, so on the tiny models
every other test builds, the lean forward could skip the norms' weight product or the projections' biases and
still agree with the stock modules bit for bit (its self-check too): the lean path would then be refused on every
real checkpoint (each step silently slower), or, with a self-check that missed it, give other tokens. Here every
norm weight and bias is random, the lean forward must be built, and its logits must be stock's bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hf_paged import Engine, PagedConfig
from tests.batching.test_lean_forward import _logits_of
from tests.tiny_models import DECODER, ragged_prompts, stock_greedy

BUILDERS = {
    "llama-biases": lambda: LlamaForCausalLM(LlamaConfig(**DECODER, attention_bias=True, mlp_bias=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**DECODER)),  # q/k/v biases by default
    "mistral": lambda: MistralForCausalLM(MistralConfig(sliding_window=24, **DECODER)),
}


def _trained_like(family: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = BUILDERS[family]().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # ones when built
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):  # zeros when built
                param.normal_(0, 0.5)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.to(dtype)


def test_the_weights_are_not_the_fresh_ones():
    model = _trained_like("llama-biases")
    assert not torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    biases = [p for n, p in model.named_parameters() if n.endswith(".bias")]
    assert len(biases) == 2 * (4 + 3) and all(p.abs().sum() > 0 for p in biases)


@pytest.mark.parametrize("family,dtype", [("llama-biases", torch.float32), ("qwen2", torch.float32),
                                          ("mistral", torch.float32), ("llama-biases", torch.bfloat16)])
def test_lean_logits_equal_the_stock_modules_with_trained_norms_and_biases(family, dtype, kernels_ready):
    model = _trained_like(family, dtype)
    prompts = ragged_prompts([5, 30, 17, 1])
    config = PagedConfig(block_size=8, max_num_batched_tokens=24)
    lean, stock = Engine(model, config), Engine(model, config)
    stock.runner.lean = None
    assert lean.runner.lean is not None  # the self-check agreed: the norms' weights and the biases are applied
    got, want = _logits_of(lean, prompts, 4), _logits_of(stock, prompts, 4)
    assert len(got) == len(want) > 3
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_greedy_tokens_equal_stock_generate_with_trained_norms_and_biases(kernels_ready):
    model = _trained_like("qwen2")
    prompts = ragged_prompts([7, 19, 3])
    engine = Engine(model, PagedConfig(block_size=8, max_num_batched_tokens=16))
    assert engine.runner.lean is not None
    from tests.tiny_models import run_engine

    assert run_engine(engine, prompts, 8) == stock_greedy(model, prompts, 8)
