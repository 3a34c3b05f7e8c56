"""`block_size="auto"`: deterministic, what the measurements adopted, reported, greedy parity; typed errors."""

import pytest
import torch

import hf_paged
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache import block_size as block_size_module
from hf_paged.cache.block_size import (
    _parse_size,
    choose_block_size,
    machine_cache_bytes,
    resolve_block_size,
    rule_of_thumb,
)
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.sizing import kv_shape_of
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


@pytest.mark.parametrize("bad, error, words", [
    ("big", TypeError, "must be an int .* or \"auto\""),
    (0, ValueError, ">= 1"),
    (24, ValueError, "power of two"),
    (512, ValueError, "power of two"),
    (16.0, TypeError, "must be an int"),
])
def test_bad_block_sizes_are_typed_errors(bad, error, words):
    with pytest.raises(error, match=words):
        PagedConfig(block_size=bad)


def test_rule_of_thumb_and_sizes():
    shape = kv_shape_of(tiny_model("llama").config)
    assert rule_of_thumb(shape, 4096, torch.bfloat16, 1 << 20) == 64  # 1 MiB / (2 x 4096 x 2 bytes)
    assert rule_of_thumb(shape, 5000, torch.bfloat16, 1 << 20) == 32  # 52 tokens: rounded down to a power of two
    assert rule_of_thumb(shape, 64, torch.float32, 32 << 20) == 256  # clipped to PagedConfig's bound
    assert rule_of_thumb(shape, 1 << 20, torch.float32, 1 << 20) == 1
    assert _parse_size("1024K") == 1 << 20 and _parse_size("2M") == 2 << 20 and _parse_size("512") == 512
    assert machine_cache_bytes("cpu") > 0


def test_auto_is_deterministic_and_what_was_measured():
    model = tiny_model("llama")
    first = choose_block_size(model.config, torch.float32, "cpu")
    assert first == choose_block_size(model.config, torch.float32, "cpu")
    assert first.block_size == 16 and "benchmarks/block_size_results.md" in first.reason
    assert first.l2_bytes == machine_cache_bytes("cpu") and first.d_model == model.config.hidden_size
    cfg = PagedConfig(block_size="auto", max_num_batched_tokens=64)
    resolved = resolve_block_size(cfg, model.config, torch.float32)
    assert resolved.block_size == 16 and resolved.max_num_batched_tokens == 64 and cfg.block_size == "auto"
    fixed = PagedConfig(block_size=8)
    assert resolve_block_size(fixed, model.config, torch.float32) is fixed


def test_auto_follows_the_measured_rule(monkeypatch):
    """The engine and the cache take whatever the rule returns (here forced to 8) and report it."""
    monkeypatch.setattr(block_size_module, "_measured_rule", lambda shape, rule: (8, "forced"))
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size="auto", num_blocks=64))
    assert engine.config.block_size == 8 and engine.cache.block_size == 8
    assert engine.stats()["block_size"] == 8 and "block_size=8" in repr(engine.config)


def test_auto_keeps_greedy_parity():
    model = tiny_model("llama")
    prompts = ragged_prompts([5, 40, 23, 2, 61], seed=3)
    expected = stock_greedy(model, prompts, 16)
    engine = Engine(model, PagedConfig(block_size="auto", max_num_batched_tokens=24))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=16)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    assert [engine.pop_output(i).generated_tokens for i in ids] == expected
    assert engine.stats()["block_size"] == 16
    hf_paged.wrap(model, block_size="auto", max_num_batched_tokens=32)
    try:
        outs = model.generate_batch(prompts, sampling_params=[SamplingParams(max_new_tokens=16)] * len(prompts))
    finally:
        hf_paged.unwrap(model)
    assert [o.generated_tokens for o in outs.values()] == expected


def test_stock_cache_path_resolves_auto():
    model = tiny_model("llama")
    cache = PagedCache(model.config, PagedConfig(block_size="auto", num_blocks=32))
    assert cache.block_size == 16 and cache.paged_config.block_size == 16
