"""The step's attention backend (chosen once per step) and the typed values a layer's engine-path update returns."""

from __future__ import annotations

import pytest
import torch

from hf_paged import PagedCache, PagedConfig
from hf_paged.cache.attention import paged_attention_forward
from hf_paged.cache.attention_backends import CpuKernelBackend, TorchBackend, TritonBackend, choose_backend
from hf_paged.cache.layer_kv import CompressedBlocks, PlainBlocks
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.errors import UnsupportedModelError
from tests.tiny_models import tiny_model


def _metadata(backend: str = "auto") -> PagedMetadata:
    # one sequence, 3 new tokens at slots 0-2 of block 1 (block_size 4)
    return PagedMetadata(slot_mapping=torch.tensor([4, 5, 6]), block_tables=torch.tensor([[1]], dtype=torch.int32),
                         query_start_loc=[0, 3], context_lens=[3], block_size=4, attention_backend=backend)


@pytest.mark.parametrize(("name", "device", "expected"), [
    ("torch", "cpu", TorchBackend), ("torch", "cuda", TorchBackend), ("triton", "cpu", TritonBackend),
    ("auto", "cuda", TritonBackend), ("auto", "cpu", CpuKernelBackend),
])
def test_one_backend_per_step_from_the_config_and_the_device(name, device, expected):
    backend = choose_backend(_metadata(name), [], torch.device(device))
    assert type(backend) is expected and backend.name == expected.name


def test_an_unknown_backend_name_is_refused():
    with pytest.raises(ValueError, match="attention_backend must be 'auto', 'torch' or 'triton'; got 'flash'"):
        choose_backend(_metadata("flash"), [], torch.device("cpu"))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_engine_update_hands_the_new_kv_through_and_the_layer_returns_a_typed_value(kv_cache_dtype):
    model = tiny_model("llama")
    cache = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=8, kv_cache_dtype=kv_cache_dtype))
    heads, dim = cache.kv_shape.num_kv_heads, cache.kv_shape.head_dim
    key, value = torch.randn(1, heads, 3, dim), torch.randn(1, heads, 3, dim)
    metadata = _metadata("torch")
    backend = choose_backend(metadata, cache.block_layers, torch.device("cpu"))
    through = cache.update(key, value, 0, kwargs={"paged_backend": backend})
    assert through[0] is key and through[1] is value and not cache.layers[0].is_initialized  # nothing stored
    kv = cache.block_layers[0].update_packed(key[0].transpose(0, 1), value[0].transpose(0, 1), metadata)
    if kv_cache_dtype == "auto":
        assert isinstance(kv, PlainBlocks) and torch.equal(kv.keys[1, :3], key[0].transpose(0, 1))
    else:  # the open block stays in full precision, in the step's touched blocks
        assert isinstance(kv, CompressedBlocks) and kv.plan.touched_ids == [1] and kv.streaming_heads == ()
        assert torch.equal(kv.touched_keys[0, :3], key[0].transpose(0, 1)) and kv.kernel_readable


def test_a_module_without_layer_idx_is_an_explicit_error():
    metadata = _metadata("torch")
    backend = choose_backend(metadata, [], torch.device("cpu"))
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4)
    with pytest.raises(UnsupportedModelError, match="has no integer `layer_idx`"):
        paged_attention_forward(torch.nn.Linear(1, 1), q, k, k, None, paged_backend=backend)


def test_the_attention_function_refuses_forwards_outside_the_engine():
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4)
    with pytest.raises(RuntimeError, match="without `paged_backend`"):
        paged_attention_forward(torch.nn.Linear(1, 1), q, k, k, None)
