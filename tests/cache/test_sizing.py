"""Default pool sizing: a share of the free memory, capped by what the sequences could ever use."""

import pytest
import torch

from hf_paged import PagedCache, PagedConfig
from hf_paged.cache import sizing
from hf_paged.errors import InvalidConfigError
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def config():
    return tiny_model("llama").config  # 2 layers, 2 KV heads x 8 dims: 256 bytes a token in fp32, 512 positions


def test_default_budget_is_a_share_of_free_memory(config, monkeypatch):
    monkeypatch.setattr(sizing, "device_memory", lambda device=None: sizing.DeviceMemory(100 * 4096, 10**12))
    assert PagedCache(config, PagedConfig(memory_fraction=0.5)).num_blocks == 50
    assert PagedCache(config, PagedConfig(memory_fraction=1.0, max_num_seqs=2)).num_blocks == 2 * 512 // 16  # cap
    assert PagedCache(config, PagedConfig(max_cache_bytes=10 * 4096)).num_blocks == 10  # an explicit budget wins


def test_memory_is_read_on_this_machine():
    memory = sizing.device_memory()
    assert memory.free is None or 0 < memory.free <= memory.total


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, True, "half"])
def test_memory_fraction_is_validated(fraction):
    with pytest.raises(ValueError, match="memory_fraction"):
        PagedConfig(memory_fraction=fraction)


def test_a_tiny_model_never_reserves_gigabytes(monkeypatch):
    """The embedded 2.3M-parameter model on a machine with 1 TB free: the default pool is what 128 sequences of its
    2048 positions could use (512 MiB), not 40% of the free memory."""
    from transformers import AutoConfig

    from hf_paged.api.models import DEFAULT_MODEL_PATH

    config = AutoConfig.from_pretrained(DEFAULT_MODEL_PATH)
    monkeypatch.setattr(sizing, "device_memory", lambda device=None: sizing.DeviceMemory(10**12, 2 * 10**12))
    cache = PagedCache(config, PagedConfig(), dtype=torch.float32)
    shape = cache.kv_shape
    per_token = shape.bytes_per_block(1, torch.float32)
    assert shape.max_model_len == 2048 and per_token == 2048
    assert cache.num_blocks == 128 * 2048 // 16
    assert cache.num_blocks * shape.bytes_per_block(16, torch.float32) == 128 * 2048 * per_token == 512 << 20
    small = PagedCache(config, PagedConfig(max_num_seqs=4), dtype=torch.float32)
    assert small.num_blocks == 4 * 2048 // 16  # the cap follows max_num_seqs
    explicit = PagedCache(config, PagedConfig(max_cache_bytes=1 << 30), dtype=torch.float32)
    assert explicit.num_blocks == (1 << 30) // shape.bytes_per_block(16, torch.float32)  # asked for: not capped


def test_a_budget_below_one_block_is_a_typed_error(config):
    with pytest.raises(InvalidConfigError, match=r"max_cache_bytes=100 is smaller than one block \(4096 bytes\)"):
        PagedCache(config, PagedConfig(max_cache_bytes=100))
