"""The lean forward's lm_head in vocabulary slices (`lean_forward._head`): the same bits as one matmul."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig
from hf_paged.batching.lean_forward import _HEAD_CHUNK, _head
from tests.batching.test_lean_forward import _logits_of
from tests.tiny_models import DECODER, ragged_prompts


def test_sliced_head_equals_one_matmul_bit_for_bit(one_thread):
    """Row counts of decode steps and of whole rolling windows, vocabularies that end in a partial slice (of a few
    columns too: MKL computes those on another path), widths of the benchmark models and tiny ones."""
    torch.manual_seed(0)
    for hidden, vocab in ((512, 50257), (256, 4 * _HEAD_CHUNK + 7), (64, 6000), (32, 4 * _HEAD_CHUNK + 1)):
        head = torch.nn.Linear(hidden, vocab, bias=False)
        for rows in (2, 3, 4, 7, 32, 33, 100, 1024):
            x = torch.randn(rows, hidden)
            with torch.inference_mode():  # as the engine runs it
                got = _head(head, x)
            assert got.shape == (rows, vocab) and got.is_contiguous()
            assert torch.equal(got, torch.mm(x, head.weight.t())), (hidden, vocab, rows)
    with torch.enable_grad():  # a head that trains: one matmul, autograd intact
        assert _head(head, x).requires_grad


def test_lean_logits_with_a_sliced_head_equal_the_stock_modules(one_thread, kernels_ready):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**DECODER, "vocab_size": 4 * _HEAD_CHUNK + 100})).eval()
    model.generation_config.eos_token_id = None
    config = PagedConfig(block_size=8, max_num_batched_tokens=24)  # chunked prefills beside decodes of 4 rows
    lean, stock = Engine(model, config), Engine(model, config)
    stock.runner.lean = None
    assert lean.runner.lean is not None
    prompts = ragged_prompts([5, 30, 17, 1], vocab=4 * _HEAD_CHUNK)
    got, want = _logits_of(lean, prompts), _logits_of(stock, prompts)
    assert len(got) == len(want) > 3 and any(g.shape[0] >= 2 for g in got)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
