"""The engine on the Triton kernels (interpreter on CPU): same greedy tokens as stock generate."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, stock_greedy


def test_engine_with_triton_backend_matches_stock():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         eos_token_id=None, pad_token_id=0)).eval()
    prompts = ragged_prompts([3, 11, 20], seed=4, vocab=64)
    expected = stock_greedy(model, prompts, 5, pad_token_id=0)
    engine = Engine(model, PagedConfig(block_size=16, attention_backend="triton", max_num_batched_tokens=16))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=5)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == expected
