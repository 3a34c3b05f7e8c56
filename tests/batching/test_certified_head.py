"""Greedy tokens from the bf16 head with a proof (`batching/certified_head.py`): always the exact head's argmax."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.certified_head import CertifiedArgmax
from hf_paged.batching.lean_forward import _HEAD_CHUNK, _head
from tests.tiny_models import DECODER, ragged_prompts, stock_greedy


def _head_module(vocab: int, hidden: int, seed: int = 0, std: float = 0.02) -> torch.nn.Linear:
    torch.manual_seed(seed)
    head = torch.nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
    head.weight.normal_(0, std)
    return head


def _exact(head, x) -> list[int]:
    return _head(head, x).argmax(dim=-1).tolist()


def _rows(count: int, hidden: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count, hidden, generator=g)
    return torch.nn.functional.rms_norm(x, (hidden,)) * (1 + 3 * torch.rand(count, 1, generator=g))


@pytest.mark.parametrize("hidden,vocab", [(512, 50257), (256, 4 * _HEAD_CHUNK + 7), (96, 6000), (64, 300)])
def test_tokens_equal_the_exact_heads_argmax(one_thread, hidden, vocab):
    head = _head_module(vocab, hidden)
    certified = CertifiedArgmax(head)
    for rows in (1, 2, 3, 4, 7, 32, 65):
        for seed in range(3):
            x = _rows(rows, hidden, seed)
            assert certified.tokens(x) == _exact(head, x), (rows, seed)
    stats = certified.stats
    assert stats.rows == 3 * sum((1, 2, 3, 4, 7, 32, 65))
    assert stats.candidates < 8 * stats.rows  # the bound leaves a handful of columns, not the vocabulary


def test_ties_and_near_ties_go_to_the_exact_values_lowest_column_first(one_thread):
    """Equal columns (exact ties: the lowest index wins, as `argmax`), and columns one fp32 step apart (the proof
    cannot separate them: the exact products settle them)."""
    hidden, vocab = 128, 5 * _HEAD_CHUNK + 33
    head = _head_module(vocab, hidden)
    w = head.weight
    w[100] = w[3000]
    w[9] = w[3000]  # three equal columns: 9 wins
    w[4500] = w[3000]
    w[4500, 0] = torch.nextafter(w[3000, 0], torch.tensor(1.0))  # a near tie, decided by the last bits
    w[777] = w[2000] * (1 + 2**-22)  # scaled by a few ulps
    certified = CertifiedArgmax(head)
    x = _rows(8, hidden, 1)
    x[0] = w[3000] * 40
    x[1] = w[2000] * 40
    x[2] = -w[3000] * 40
    x[5] = (w[3000] + w[2000]) * 30
    assert certified.tokens(x) == _exact(head, x)
    assert certified.tokens(x)[0] in (9, 4500)
    assert certified.stats.open_rows >= 2 and certified.stats.whole_heads == 0  # settled by the sliced products


def test_open_rows_without_the_sliced_products_compute_the_whole_head(one_thread):
    hidden, vocab = 64, 4 * _HEAD_CHUNK + 5
    head = _head_module(vocab, hidden)
    head.weight[50] = head.weight[60]
    certified = CertifiedArgmax(head)
    x = _rows(3, hidden, 2)  # fewer rows than MKL's row-independent products need
    x[1] = head.weight[60] * 40
    assert certified.tokens(x) == _exact(head, x)
    assert certified.stats.whole_heads == 1
    two = CertifiedArgmax(head, rows_independent=False)  # the lean forward's row check failed: never slices
    x = _rows(8, hidden, 3)
    x[4] = head.weight[60] * 40
    assert two.tokens(x) == _exact(head, x) and two.stats.whole_heads == 1


def test_non_finite_rows_and_huge_values_give_the_exact_argmax(one_thread):
    hidden, vocab = 64, 4 * _HEAD_CHUNK + 5
    head = _head_module(vocab, hidden)
    certified = CertifiedArgmax(head)
    x = _rows(6, hidden, 4)
    x[0, 3] = float("nan")
    x[1, 0] = float("inf")
    x[2] = x[2] * 1e36  # overflows the fp32 products
    assert certified.tokens(x) == _exact(head, x)


def test_a_weight_changed_in_place_is_seen(one_thread):
    head = _head_module(6000, 64)
    certified = CertifiedArgmax(head)
    x = _rows(4, 64, 5)
    assert certified.tokens(x) == _exact(head, x)
    head.weight.mul_(-1)  # every argmax moves
    assert certified.tokens(x) == _exact(head, x)
    head.weight = torch.nn.Parameter(torch.randn(6000, 64) * 0.02, requires_grad=False)  # replaced
    assert certified.tokens(x) == _exact(head, x)
    head.weight.data.mul_(-1)  # through .data (as fused optimizers write): no version counter moves
    assert certified.tokens(x) == _exact(head, x)
    head.weight.requires_grad_(True)
    optimizer = torch.optim.AdamW([head.weight], lr=1.0, fused=True)
    head.weight.grad = torch.randn_like(head.weight)
    optimizer.step()
    assert certified.tokens(x) == _exact(head, x)


def test_applies_to_plain_fp32_cpu_heads_only():
    assert not CertifiedArgmax.applies(torch.nn.Linear(64, 6000), forced=True)  # a bias
    assert not CertifiedArgmax.applies(torch.nn.Linear(64, 6000, bias=False).half(), forced=True)
    assert CertifiedArgmax.applies(torch.nn.Linear(64, 6000, bias=False), forced=True)
    assert not CertifiedArgmax.applies(torch.nn.Linear(64, 300, bias=False))  # small: auto leaves it exact
    assert not CertifiedArgmax.applies(torch.nn.Linear(64, 2**15, bias=False))  # 2M weights, but 64 wide
    with pytest.raises(ValueError, match="certified_argmax"):
        PagedConfig(certified_argmax="yes")


def _model(vocab: int = 6000):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**DECODER, "vocab_size": vocab})).eval()
    model.generation_config.eos_token_id = None
    return model


def test_engine_greedy_equals_stock_through_the_certified_head(one_thread):
    model = _model()
    prompts = ragged_prompts([5, 30, 17, 1, 9, 12], vocab=6000)
    want = stock_greedy(model, prompts, 12)
    for flag in (True, False):
        engine = Engine(model, PagedConfig(block_size=8, max_num_batched_tokens=24, certified_argmax=flag))
        assert (engine.runner.certified is not None) is flag
        assert not flag or engine.runner.certified.ready(60)  # its copy of the head, made in the background
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=12)) for p in prompts]
        outs = engine.run(ids)
        assert [outs[i].generated_tokens for i in ids] == want
        assert (engine.stats()["certified_head_rows"] >= len(prompts) * 12) is flag


def test_a_step_with_a_sampled_or_logprobs_row_takes_the_sampler(one_thread):
    """Only steps whose every row is plain greedy use the certified head; others get full logits."""
    model = _model()
    prompts = ragged_prompts([6, 11, 4], vocab=6000)
    want = stock_greedy(model, prompts[:1], 8)
    engine = Engine(model, PagedConfig(block_size=8, certified_argmax=True))
    greedy = engine.add_request(prompts[0], SamplingParams(max_new_tokens=8))
    logprobs = engine.add_request(prompts[1], SamplingParams(max_new_tokens=8, logprobs=2))
    sampled = engine.add_request(prompts[2], SamplingParams(max_new_tokens=8, do_sample=True, seed=3))
    outs = engine.run([greedy, logprobs, sampled])
    assert outs[greedy].generated_tokens == want[0]
    assert len(outs[logprobs].logprobs) == 8 and len(outs[sampled].generated_tokens) == 8
    assert engine.runner.certified.stats.rows == 0  # every step had a row that needs its logits


def test_a_head_of_equal_columns_is_settled_exactly_without_a_huge_gather(one_thread):
    """A zero head (every column ties) or many repeated columns: more candidates than `MAX_CANDIDATES`, so the row
    goes to the exact head instead of gathering thousands of columns."""
    from hf_paged.batching.certified_head import MAX_CANDIDATES

    head = _head_module(4 * _HEAD_CHUNK + 9, 64)
    certified = CertifiedArgmax(head)
    x = _rows(5, 64, 6)
    head.weight[:2000] = head.weight[1234]  # 2,000 equal columns
    x[0] = head.weight[1234] * 40
    assert certified.tokens(x) == _exact(head, x) and certified.tokens(x)[0] == 0
    assert certified.stats.candidates <= 2 * 5 * MAX_CANDIDATES
    head.weight.zero_()
    assert certified.tokens(x) == _exact(head, x) == [0] * 5


def test_engines_over_one_weight_share_its_copy(one_thread):
    from hf_paged.batching.certified_head import head_copy

    head = _head_module(6000, 64)
    first = head_copy(head.weight)
    assert head_copy(head.weight) is first
    head.weight.add_(0.0)  # an in-place write (its version counter moves): copied again
    assert head_copy(head.weight) is not first


def test_steps_before_the_background_copy_is_made_take_the_exact_head(one_thread, monkeypatch):
    """The engine's copy of the head is made by a thread: until it exists the steps take the exact head (the same
    tokens), none waits for it; a build that fails leaves the exact head serving."""
    from hf_paged.batching import certified_head

    model = _model(vocab=6007)  # a weight no other test has copied
    prompts = ragged_prompts([5, 9, 13], vocab=6000)
    want = stock_greedy(model, prompts, 10)
    release = threading.Event()
    build = certified_head._build

    def held(weight):
        release.wait(60)
        return build(weight)

    monkeypatch.setattr(certified_head, "_build", held)
    engine = Engine(model, PagedConfig(block_size=8, certified_argmax=True))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=10)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == want
    head = engine.runner.certified
    assert head.stats.rows == 0 and head.stats.exact_steps > 0 and not head.ready(0)
    release.set()
    assert head.ready(60)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=10)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == want and head.stats.rows > 0

    def broken(weight):
        raise MemoryError("no room for the copy")

    monkeypatch.setattr(certified_head, "_build", broken)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.0)  # a new version of the weight: a new copy is asked for, and fails
    rows = head.stats.rows
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=10)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == want
    assert engine.runner.certified is head  # (new values in the same tensors: the runner's parts are kept)
    head._builder.join(60)
    assert isinstance(head._failed, MemoryError) and head.stats.rows == rows and not head.ready(0)
