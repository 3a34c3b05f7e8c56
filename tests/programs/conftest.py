"""A tiny random Llama over a byte-level tokenizer, wrapped with small blocks (fast, offline)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.wrap_state import engine_of
from tests.tiny_models import byte_tokenizer


def tiny_byte_llama(seed: int = 0):
    tok = byte_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512, eos_token_id=tok.eos_token_id,
                                         pad_token_id=tok.eos_token_id, bos_token_id=None)).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.eos_token_id
    return model, tok


def wrapped_llama_over(tok):
    """A tiny random Llama (seed 1) over `tok`'s vocabulary, EOS and padding the tokenizer's, wrapped with blocks of 8."""
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, eos_token_id=tok.eos_token_id,
                                         pad_token_id=tok.eos_token_id, bos_token_id=None)).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    return hf_paged.wrap(model, block_size=8, num_blocks=64)


@pytest.fixture
def model_tok():
    model, tok = tiny_byte_llama()
    hf_paged.wrap(model, block_size=8, num_blocks=256)
    yield model, tok
    engine = engine_of(model)
    engine.check_integrity()
    assert not engine.live_requests()
    assert engine.cache.pool.num_used_blocks == 0  # no request left and no pin held after a run
