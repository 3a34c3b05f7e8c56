"""The engine on the Triton kernels (interpreter on CPU): same greedy tokens as stock generate."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.kernels import KernelArgumentError
from tests.kernels.paged_cases import DEVICE
from tests.tiny_models import ragged_prompts, stock_greedy


def test_engine_with_triton_backend_matches_stock():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         eos_token_id=None, pad_token_id=0)).eval().to(DEVICE)
    prompts = ragged_prompts([3, 11, 20], seed=4, vocab=64)
    expected = stock_greedy(model, prompts, 5, pad_token_id=0)
    engine = Engine(model, PagedConfig(block_size=16, attention_backend="triton", max_num_batched_tokens=16))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=5)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == expected


COMPRESSED = {
    "int8": {"kv_cache_dtype": "int8"},
    "int4": {"kv_cache_dtype": "int4"},
    "int4, values per head": {"kv_cache_dtype": "int4", "value_quant_group": "head"},
    "int4, values per head, log8 scales": {"kv_cache_dtype": "int4", "value_quant_group": "head",
                                           "kv_scale_format": "log8"},
    # keys in the block's RoPE frame: the kernels do not rotate, so the torch path under "triton" too
    "int4, log8, keys derotated": {"kv_cache_dtype": "int4", "value_quant_group": "head", "kv_scale_format": "log8",
                                   "kv_key_derotate": True},
    # head groups of two formats: the torch path, even under attention_backend="triton"
    "int8, head 0 full precision": {"kv_cache_dtype": "int8", "kv_full_precision_heads": ((0,), (0,))},
    # SnapKV scores the last prompt chunk on the torch path; the decodes after it run fused
    "int4 + snapkv": {"kv_cache_dtype": "int4", "kv_pruning": "snapkv", "kv_keep_ratio": 0.5, "window_tokens": 8,
                      "num_sink_tokens": 4},
}

TORCH_PATH = {"int8, head 0 full precision", "int4, log8, keys derotated"}  # settings the fused kernels cannot read


@pytest.mark.parametrize("setting", list(COMPRESSED))
def test_engine_on_fused_dequant_kernels_matches_the_torch_path(setting, monkeypatch):
    # Chunked prefill (chunks start mid-block) and decodes across block boundaries, on quantized blocks: the
    # Triton path must run the fused kernels (not dequantize blocks) and give the torch path's tokens.
    from hf_paged.cache.attention_backends import TritonBackend

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         eos_token_id=None, pad_token_id=0)).eval().to(DEVICE)
    prompts = ragged_prompts([3, 11, 21], seed=5, vocab=64)
    outputs, fused_calls = {}, []
    original = TritonBackend.attend_fused

    def spy(self, kv, q, *args, **kwargs):
        fused_calls.append(q.shape[0])
        return original(self, kv, q, *args, **kwargs)

    monkeypatch.setattr(TritonBackend, "attend_fused", spy)
    for backend in ("torch", "triton"):
        config = PagedConfig(block_size=8, attention_backend=backend, max_num_batched_tokens=16, **COMPRESSED[setting])
        engine = Engine(model, config)
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=4)) for p in prompts]
        outs = engine.run(ids)
        outputs[backend] = [outs[i].generated_tokens for i in ids]
        assert bool(fused_calls) == (backend == "triton" and setting not in TORCH_PATH)
    assert outputs["triton"] == outputs["torch"]
    if setting not in TORCH_PATH:
        assert len(fused_calls) >= 2 * 3  # both layers of every step (of the 3 decode-only steps at least)


def test_triton_backend_on_cpu_without_the_interpreter_is_refused_up_front(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    # the message names the field the user set and the fix (h7: it named a `backend=` argument)
    refused = r"PagedConfig.attention_backend='triton' got tensors on cpu.*TRITON_INTERPRET=1.*'auto'.*'torch'"
    with pytest.raises(KernelArgumentError, match=refused):
        Engine(model, PagedConfig(attention_backend="triton"))


@pytest.mark.parametrize("split_nibbles", [True, False])
@pytest.mark.parametrize("setting", ["int4", "int4, values per head, log8 scales"])
def test_engine_int4_decode_on_both_int4_kernels_matches_the_torch_path(setting, split_nibbles, monkeypatch):
    # head_dim 32: the split-nibble kernel applies (launch.INT4_SPLIT_NIBBLES, both values), keys per channel and
    # values per token or per head as the engine stores them.
    from hf_paged.cache.kernels import launch, triton_decode

    monkeypatch.setattr(launch, "INT4_SPLIT_NIBBLES", split_nibbles)
    kernels = []
    original = triton_decode.decode_launches

    def spy(*args, **kwargs):
        launches = original(*args, **kwargs)
        kernels.append(launches[0].kernel.__name__)
        return launches

    monkeypatch.setattr(triton_decode, "decode_launches", spy)
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                         eos_token_id=None, pad_token_id=0)).eval().to(DEVICE)
    prompts = ragged_prompts([3, 11, 21], seed=6, vocab=64)
    outputs = {}
    for backend in ("torch", "triton"):
        config = PagedConfig(block_size=8, attention_backend=backend, max_num_batched_tokens=16, **COMPRESSED[setting])
        engine = Engine(model, config)
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=5)) for p in prompts]
        outs = engine.run(ids)
        outputs[backend] = [outs[i].generated_tokens for i in ids]
    assert outputs["triton"] == outputs["torch"]
    expected = "_decode_split_kernel" if split_nibbles else "_decode_kernel"
    assert len(kernels) >= 2 * 3 and set(kernels) == {expected}
