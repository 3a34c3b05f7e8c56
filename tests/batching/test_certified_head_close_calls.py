"""Close calls for the certified greedy head (`batching/certified_head.py`): rows built so that the bf16 product
ranks two columns the other way round from the exact fp32 head, by as much as the proof's bound allows. A bound
missing a term, or halved, leaves the exact argmax out of the candidates and certifies the wrong token; random
rows never come near (their rounding errors are a small fraction of the bound)."""

from __future__ import annotations

import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.certified_head import CertifiedArgmax
from hf_paged.batching.lean_forward import _HEAD_CHUNK, _head
from tests.tiny_models import DECODER, ragged_prompts, stock_greedy

WIDTH = 128


def _reversed_by_input_rounding() -> tuple[torch.nn.Linear, torch.Tensor]:
    """Column 0 is w = +-1 (exact in bf16), column 1 is -w. The row x = b + 2^-10 w, where b (ones, twelve of them
    at 1 + 2^-7 on w's negative side) is x rounded to bf16: x~ . w = -12 * 2^-7 < 0 < x . w = 2^-5. The bf16 product
    puts column 1 first by 2 * 0.094, within twice the input-rounding term |x - x~| max|w_j| = 0.125 of the bound
    (dx points along w, so Cauchy-Schwarz is tight), but beyond the bound without that term, or with it counted
    once."""
    signs = torch.ones(WIDTH)
    signs[WIDTH // 2:] = -1
    b = torch.ones(WIDTH)
    b[WIDTH // 2 + torch.arange(12)] = 1 + 2**-7
    x = b + 2**-10 * signs
    assert torch.equal(x.to(torch.bfloat16).float(), b)
    head = torch.nn.Linear(WIDTH, 2, bias=False).requires_grad_(False)
    head.weight[0] = signs
    head.weight[1] = -signs
    return head, x[None]


def test_a_row_whose_bf16_rounding_reverses_the_order_gets_the_exact_argmax(one_thread):
    head, x = _reversed_by_input_rounding()
    bf16 = (x.to(torch.bfloat16) @ head.weight.to(torch.bfloat16).t()).float()
    assert bf16[0, 1] > bf16[0, 0] and _head(head, x)[0, 0] > _head(head, x)[0, 1]  # the reversal itself
    certified = CertifiedArgmax(head)
    assert certified.tokens(x) == [0] == _head(head, x).argmax(-1).tolist()
    assert certified.stats.candidates == 2  # both columns kept: the exact values decided


def test_the_reversal_inside_a_large_head_and_beside_other_rows(one_thread):
    """The same row among ordinary ones, its two columns in the vocabulary's remainder past the last full slice."""
    vocab = 5 * _HEAD_CHUNK + 33
    torch.manual_seed(0)
    head = torch.nn.Linear(WIDTH, vocab, bias=False).requires_grad_(False)
    head.weight.normal_(-0.01, 0.0001)  # the constructed row: -1.28 here, far below both columns' +-0.09
    small, row = _reversed_by_input_rounding()
    head.weight[vocab - 7] = small.weight[1]  # the bf16 favourite first
    head.weight[vocab - 3] = small.weight[0]  # the exact argmax
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, WIDTH, generator=g)
    x[2] = row[0]
    certified = CertifiedArgmax(head)
    got = certified.tokens(x)
    assert got == _head(head, x).argmax(-1).tolist() and got[2] == vocab - 3


def test_the_argmax_in_the_vocabularys_remainder_is_found(one_thread):
    """Rows whose best column lies past the last 1,024-column block (found by the tail's own pass)."""
    vocab = 4 * _HEAD_CHUNK + 7
    torch.manual_seed(1)
    head = torch.nn.Linear(64, vocab, bias=False).requires_grad_(False)
    head.weight.normal_(0, 0.02)
    x = torch.randn(5, 64)
    for r, column in enumerate((vocab - 1, vocab - 4, vocab - 7)):
        x[r] = head.weight[column] * 40
    got = CertifiedArgmax(head).tokens(x)
    assert got == _head(head, x).argmax(-1).tolist() and got[:3] == [vocab - 1, vocab - 4, vocab - 7]


def test_a_replaced_lm_head_is_the_one_the_certified_head_reads(one_thread):
    """`model.lm_head = new module` (new weights): the engine's weights check rebuilds the lean forward, and the
    certified head with it; greedy tokens follow the new head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**DECODER, "vocab_size": 6000})).eval()
    model.generation_config.eos_token_id = None
    prompts = ragged_prompts([5, 9, 13], vocab=6000)
    engine = Engine(model, PagedConfig(block_size=8, certified_argmax=True))
    assert engine.runner.certified.ready(60)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in prompts]
    engine.run(ids)
    new_head = torch.nn.Linear(DECODER["hidden_size"], 6000, bias=False)
    torch.nn.init.normal_(new_head.weight, 0, 0.5)
    model.lm_head = new_head
    want = stock_greedy(model, prompts, 6)
    for _ in range(2):  # the first run may take the exact head while the new copy is made
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in prompts]
        outs = engine.run(ids)
        assert [outs[i].generated_tokens for i in ids] == want
        engine.runner.certified.ready(60)
    assert engine.runner.certified.head is model.lm_head


def test_a_bf16_rounding_of_the_product_that_splits_two_columns_gets_the_exact_argmax(one_thread):
    """Two columns whose fp32-accumulated bf16 products differ by 2^-12 around 130, on either side of a bf16
    rounding boundary (ulp 1 there: 129.5 for round-to-nearest-even, 130 for truncation), ordered against their
    exact values by the inputs' rounding: the rounded products split by a whole bf16 step, which only the bound's
    term for the product's own rounding (2u max|A|) covers; counted as u/2, the exact argmax is left out."""
    k, m, rest = torch.arange(0, 32), torch.arange(32, 64), torch.arange(64, WIDTH)
    head = torch.nn.Linear(WIDTH, 2, bias=False).requires_grad_(False)
    head.weight[0] = 1.0
    head.weight[0, k] += 2**-7
    head.weight[0, m] -= 2**-7
    head.weight[1] = 1.0
    rows = []
    for last in (2.46875, 2.96875):  # x~ . w_1 just above 129.5, and just above 130
        b = torch.ones(WIDTH)
        b[m[:4]] = 1 + 2**-7
        b[rest[-1]] = last
        x = b.clone()
        x[k] += 2**-9  # rounds back to b; x . (w_0 - w_1) = 2^-12 > 0 > x~ . (w_0 - w_1) = -2^-12
        assert torch.equal(x.to(torch.bfloat16).float(), b)
        rows.append(x)
    x = torch.stack(rows)
    bf16 = (x.to(torch.bfloat16) @ head.weight.to(torch.bfloat16).t()).float()
    assert (bf16[:, 1] - bf16[:, 0]).max() == 1.0  # a whole step apart on this CPU's rounding
    assert CertifiedArgmax(head).tokens(x) == [0, 0] == _head(head, x).argmax(-1).tolist()
