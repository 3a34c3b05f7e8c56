"""The lean forward's last layer on the kept rows only (`LeanForward.prune`): the same bits as every row, or off."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig
from hf_paged.batching.lean_forward import MIN_PRUNED_ROWS, LeanForward, _pruned_rows
from hf_paged.batching.row_kernels import independent_rows
from tests.batching.test_lean_forward import VARIANTS, _logits_of
from tests.tiny_models import DECODER, ragged_prompts, tiny_model


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen2-sliding", "llama-biases"])
def test_pruned_logits_equal_the_stock_modules_bit_for_bit(family, one_thread, kernels_ready):
    model = VARIANTS[family]() if family in VARIANTS else tiny_model(family)
    prompts = ragged_prompts([5, 30, 17, 1, 9, 12])
    config = PagedConfig(block_size=8, max_num_batched_tokens=24)  # chunked prefills beside decodes
    lean, stock = Engine(model, config), Engine(model, config)
    stock.runner.lean = None
    assert lean.runner.lean is not None and lean.runner.lean.prune
    rows_run = []
    forward = lean.runner.lean.__call__

    class Counting:  # the steps that pruned: fewer rows than tokens in the last layer
        def __call__(self, ids, positions, keep, attend):
            rows_run.append(_pruned_rows(keep, ids.shape[1]) is not None)
            return forward(ids, positions, keep, attend)

        def usable(self):
            return True

    lean.runner.lean = Counting()
    got, want = _logits_of(lean, prompts), _logits_of(stock, prompts)
    assert any(rows_run) and len(got) == len(want) > 3
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_matmul_rows_do_not_depend_on_the_other_rows_from_this_cpus_threshold(one_thread):
    """What pruning rests on, over every row count a step of the default budget (512) can have: on one thread, the
    rows of an M-row product are bit for bit those rows of the 512-row product once M reaches the threshold
    `independent_rows` measures on this CPU (4 on AVX2; 16 on AVX-512, where the fixed 4 of before gave other bits for
    5-15 rows and pruned logits differed from stock's), for the shapes of the benchmark models and the tiny ones, on
    other data than the probe's."""
    torch.manual_seed(1)
    for k, n in ((256, 256), (256, 128), (256, 704), (704, 256), (256, 1000), (32, 64), (64, 32), (32, 96)):
        start = independent_rows({(k, n)})
        assert start is not None and start >= MIN_PRUNED_ROWS, (k, n)
        weight, x = torch.randn(n, k), torch.randn(512, k)
        full = torch.mm(x, weight.t())
        bad = [m for m in range(start, 512) if not torch.equal(torch.mm(x[:m], weight.t()), full[:m])]
        assert bad == [], (k, n, start, bad[:10])


def test_the_rows_a_pruned_layer_runs():
    keep = torch.tensor([7, 2])
    rows = _pruned_rows(keep, 10)
    assert rows[:2].tolist() == [7, 2] and len(rows) == MIN_PRUNED_ROWS == len(set(rows.tolist()))
    assert _pruned_rows(torch.tensor([3, 1, 0, 5, 6]), 9).tolist() == [3, 1, 0, 5, 6]
    assert _pruned_rows(torch.tensor([0, 1]), 4) is None  # padding to four rows saves nothing
    assert _pruned_rows(torch.arange(6), 6) is None  # a decode step keeps every row


def test_no_pruning_where_it_could_change_bits(one_thread):
    torch.manual_seed(0)
    odd = LlamaForCausalLM(LlamaConfig(**{**DECODER, "intermediate_size": 72})).eval()  # a scalar tail in silu
    lean = LeanForward.build(odd)
    assert lean is not None and not lean.prune
    assert not LeanForward.build(tiny_model("llama").to(torch.bfloat16)).prune
    torch.set_num_threads(2)  # rows are split among threads: built with two, it never prunes
    assert not LeanForward.build(tiny_model("llama")).prune


def test_a_pruned_path_that_disagrees_falls_back_to_every_row(one_thread, monkeypatch):
    from hf_paged.batching import lean_forward

    monkeypatch.setattr(lean_forward, "_pruned_rows", lambda keep, tokens: torch.arange(tokens - 1))  # wrong rows
    lean = LeanForward.build(tiny_model("llama"))
    assert lean is not None and not lean.prune


def test_pruned_logits_of_a_wider_model_equal_stocks_on_this_cpu(one_thread, kernels_ready):
    """Widths where this CPU's row threshold may pass 4 (16 on an AVX-512 Xeon for k >= 256): pruned with the measured
    `min_rows`, the logits are stock's bit for bit; with the fixed 4 of before, 3 of these 8 requests' logits differed
    there (on AVX2 the threshold is 4 and both agree)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                         max_position_embeddings=512)).eval()
    prompts = ragged_prompts([5, 30, 17, 1, 9, 12, 40, 3])
    config = PagedConfig(block_size=8, max_num_batched_tokens=48)
    lean, stock = Engine(model, config), Engine(model, config)
    stock.runner.lean = None
    assert lean.runner.lean is not None and lean.runner.lean.prune
    assert lean.runner.lean.min_rows == independent_rows({(256, 256), (256, 704), (704, 256), (256, 1024)})
    got, want = _logits_of(lean, prompts), _logits_of(stock, prompts)
    assert len(got) == len(want) == len(prompts) and all(torch.equal(a, b) for a, b in zip(got, want))
