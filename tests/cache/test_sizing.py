"""Default pool sizing: a share of the free memory, capped by what the sequences could ever use."""

import pytest

from hf_paged import PagedCache, PagedConfig
from hf_paged.cache import sizing
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
