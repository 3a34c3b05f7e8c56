"""Arguments are checked before any launch, with errors that name the argument and the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hf_paged.cache.kernels import KernelArgumentError, paged_decode_attention, paged_prefill_attention, store_kv
from hf_paged.errors import HfPagedError
from tests.kernels.paged_cases import DEVICE, make_case


@pytest.fixture
def case():
    return make_case([20, 3], [4, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)


def _decode(case, **overrides):
    args = {
        "query": case.query[:2],
        "key_cache": case.key_cache,
        "value_cache": case.value_cache,
        "block_tables": case.block_tables,
        "context_lens": case.context_lens,
    }
    args.update(overrides)
    kwargs = {
        "scale": overrides.pop("scale", case.scale),
        "backend": overrides.pop("backend", "triton"),
        "sliding_window": overrides.pop("sliding_window", None),
    }
    return paged_decode_attention(
        *[args[k] for k in ("query", "key_cache", "value_cache", "block_tables", "context_lens")], **kwargs
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"query": torch.zeros(2, 4)}, "query must have 3 dimensions"),
        ({"query": torch.zeros(2, 3, 16)}, "not a multiple of the caches' 2 KV heads"),
        ({"query": torch.zeros(2, 4, 8)}, "query.shape[2] is 8 but the caches' head_dim is 16"),
        ({"query": torch.zeros(2, 4, 16, dtype=torch.float16)}, "pass query.to(torch.float32)"),
        ({"block_tables": torch.zeros(2, 3, dtype=torch.int64)}, "block_tables must have dtype int32"),
        ({"block_tables": torch.zeros(3, 3, dtype=torch.int32)}, "block_tables.shape[0] is 3 but num_seqs is 2"),
        ({"context_lens": torch.tensor([1, 2, 3], dtype=torch.int32)}, "context_lens.shape[0] is 3"),
        ({"context_lens": torch.tensor([[1, 2]], dtype=torch.int32)}, "context_lens must have 1 dimensions"),
        ({"value_cache": torch.zeros(6, 16, 2, 16, dtype=torch.float16)}, "store both in one dtype"),
        ({"value_cache": torch.zeros(6, 8, 2, 16)}, "must have one shape"),
        ({"key_cache": torch.zeros(6, 16, 2, 16, dtype=torch.int8)}, "key_cache must have dtype float16, bfloat16"),
        ({"scale": 0.0}, "scale must be a positive float"),
        ({"sliding_window": 0}, "sliding_window must be None or an int >= 1"),
        ({"backend": "cuda"}, "backend must be one of"),
        ({"query": torch.zeros(2, 16, 4).transpose(1, 2)}, "pass query.contiguous()"),
        ({"query": torch.zeros(2, 4, 16, device="meta")}, "must be on one device"),
    ],
)
def test_decode_rejects_bad_arguments(case, overrides, message):
    assert case.key_cache.shape == (6, 16, 2, 16)  # 3 blocks in use + 3 spare
    overrides = {
        k: (v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v)
        for k, v in overrides.items()
    }
    with pytest.raises(KernelArgumentError) as info:
        _decode(case, **overrides)
    assert message in str(info.value)
    assert isinstance(info.value, (HfPagedError, ValueError))


@pytest.mark.parametrize(
    "qsl,message",
    [
        (torch.tensor([0, 4], dtype=torch.int32), "query_start_loc.shape[0] is 2 but num_seqs + 1"),
        (torch.tensor([0, 4, 5], dtype=torch.int64), "query_start_loc must have dtype int32"),
    ],
)
def test_prefill_checks_query_start_loc(case, qsl, message):
    with pytest.raises(KernelArgumentError) as info:
        paged_prefill_attention(
            case.query,
            case.key_cache,
            case.value_cache,
            case.block_tables,
            qsl.to(DEVICE),
            case.context_lens,
            scale=case.scale,
            backend="triton",
        )
    assert message in str(info.value)


def test_store_checks_its_arguments(case):
    key = torch.zeros(3, 2, 16, device=DEVICE)
    slots = torch.tensor([0, 1, 2], device=DEVICE)
    with pytest.raises(KernelArgumentError, match="slot_mapping must have dtype int64"):
        store_kv(key, key, case.key_cache, case.value_cache, slots.int(), backend="triton")
    with pytest.raises(KernelArgumentError, match="slot_mapping.shape.0. is 2 but key's num_tokens is 3"):
        store_kv(key, key, case.key_cache, case.value_cache, slots[:2], backend="triton")
    with pytest.raises(KernelArgumentError, match=r"pass key.to\(torch.float32\)"):
        store_kv(key.half(), key, case.key_cache, case.value_cache, slots, backend="triton")
    with pytest.raises(KernelArgumentError, match="key.shape.1. is 3 but the caches' num_kv_heads is 2"):
        store_kv(torch.zeros(3, 3, 16, device=DEVICE), key, case.key_cache, case.value_cache, slots)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="CPU tensors only")
def test_triton_backend_on_cpu_without_the_interpreter_says_what_to_do(case, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelArgumentError, match="set TRITON_INTERPRET=1 .* or pass backend='torch'"):
        _decode(case)


def test_importing_the_kernels_neither_imports_triton_nor_defines_kernels():
    # A fresh interpreter: `import hf_paged` must work without triton, and the jit functions are defined at first
    # use, so TRITON_INTERPRET set later (e.g. in a conftest) still takes effect.
    code = (
        "import sys, hf_paged\n"
        "from hf_paged.cache.kernels import triton_decode, triton_prefill, triton_store, paged_decode_attention\n"
        "assert 'triton' not in sys.modules, 'triton imported at module level'\n"
        "assert not (triton_decode._DEFINED or triton_prefill._DEFINED or triton_store._DEFINED)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # a fresh interpreter importing torch and transformers: 1.7 s of CPU, but 61 s of wall time measured at load 17
    # on 2 shared cores, so the bound is for a hang, not for speed
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
