"""The fused-dequant kernels read one-byte log8 scale codes (`PagedConfig.kv_scale_format="log8"`).

Triton (the interpreter on CPU) and the torch reference against the dense oracle, and a real sm_90 / sm_80 compile
of the log8 variants (no GPU needed, like test_kernel_compile). The engine on them: test_engine_triton's table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hf_paged.cache.compression import BlockFormat
from hf_paged.cache.kernels import QuantizedKV, paged_decode_attention
from hf_paged.cache.kernels.quantized import LOG_SCALE_CODE, kv_operand
from tests.kernels.paged_cases import make_case
from tests.kernels.quantized_cases import assert_kernels_match_oracle, quantize_case, requantize
from tests.kernels.test_kernel_compile import ROOT, _nvidia_tools_present

FORMATS = {
    "int4 K per channel, V per head": (BlockFormat("int4", per_channel=True, log_scale=True),
                                       BlockFormat("int4", per_head=True, log_scale=True)),
    "int4 V per token": (BlockFormat("int4", per_channel=True, log_scale=True), BlockFormat("int4", log_scale=True)),
    "int8": (BlockFormat("int8", log_scale=True), BlockFormat("int8", log_scale=True)),
    "fp8, V per head": (BlockFormat("fp8", log_scale=True), BlockFormat("fp8", per_head=True, log_scale=True)),
}


@pytest.mark.parametrize("formats", list(FORMATS))
def test_fused_kernels_read_log_scales(formats):
    key, value = FORMATS[formats]
    for context_lens, q_lens in (([1, 17, 40], [1, 1, 1]), ([20, 40], [7, 40])):
        case = make_case(context_lens, q_lens, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                         dtype=torch.float32, seed=3)
        qc = requantize(quantize_case(case, key.name, value.name, seed=1), key, value)
        assert qc.key.scale.dtype == torch.uint8 and kv_operand(qc.key).fmt >= LOG_SCALE_CODE
        assert_kernels_match_oracle(qc)


def test_log_codes_change_what_the_kernel_reads():
    # The same data read with its scales as fp16 values vs as codes: the kernel must decode, not cast.
    key, value = FORMATS["int8"]
    case = make_case([24], [1], num_heads=2, num_kv_heads=1, head_dim=8, block_size=8, dtype=torch.float32, seed=0)
    qc = requantize(quantize_case(case, key.name, value.name, seed=1), key, value)
    right = paged_decode_attention(case.query, qc.key, qc.value, case.block_tables, case.context_lens,
                                   scale=case.scale, tail=qc.tail, backend="triton")
    as_fp16 = QuantizedKV(qc.key.data, qc.key.scale.half(), "int8")  # codes 150.. taken literally
    wrong = paged_decode_attention(case.query, as_fp16, qc.value, case.block_tables, case.context_lens,
                                   scale=case.scale, tail=qc.tail, backend="triton")
    assert not torch.allclose(right, wrong, atol=1e-2)


_COMPILE = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
import torch
import gpu_compile_check as g
from hf_paged.cache.kernels.launch import decode_launch_config
from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV
from hf_paged.cache.kernels.triton_decode import decode_launches
from hf_paged.cache.kernels.triton_prefill import prefill_launch

meta = torch.device("meta")
blocks, bs, kv_heads, dim, heads, batch, ctx = 64 * 256 + 1, 16, 8, 128, 32, 64, 4096
cache = torch.empty(blocks, bs, kv_heads, dim, dtype=torch.bfloat16, device=meta)
data = torch.empty(blocks, bs, kv_heads, dim // 2, dtype=torch.uint8, device=meta)
channel = torch.empty(blocks, kv_heads, dim, dtype=torch.uint8, device=meta)
per_head = torch.empty(blocks, bs, kv_heads, dtype=torch.uint8, device=meta)
key = QuantizedKV(data, channel, "int4", torch.empty_like(channel, dtype=torch.int8), per_channel=True)
value = QuantizedKV(data, per_head, "int4", torch.empty_like(per_head, dtype=torch.int8), per_head=True)
tables = torch.empty(batch, ctx // bs, dtype=torch.int32, device=meta)
lens = torch.empty(batch, dtype=torch.int32, device=meta)
query = torch.empty(batch, heads, dim, dtype=torch.bfloat16, device=meta)
packed = torch.empty(2048, heads, dim, dtype=torch.bfloat16, device=meta)
qsl = torch.empty(batch + 1, dtype=torch.int32, device=meta)
tail = FullPrecisionTail(cache[: 2 * batch], cache[: 2 * batch], tables)
config = decode_launch_config(num_seqs=batch, num_heads=heads, num_kv_heads=kv_heads, head_dim=dim,
                              max_context_len=ctx, dtype=torch.bfloat16, num_sms=g.NUM_SMS, quantized=True)
launches = [*decode_launches(query, key, value, tables, lens, torch.empty_like(query), scale=0.1, tail=tail,
                             config=config),
            *decode_launches(query, key, value, tables, lens, torch.empty_like(query), scale=0.1, tail=tail,
                             config=dataclasses.replace(config, split_nibbles=not config.split_nibbles))[:1],
            prefill_launch(packed, key, value, tables, qsl, lens, torch.empty_like(packed), scale=0.1, tail=tail)]
results = []
for launch in launches:
    for capability in (90, 80):
        registers, spills, shared = g.compile_launch(launch, capability)
        results.append([launch.kernel.__name__, capability, registers, spills, shared])
print(json.dumps(results))
"""


@pytest.mark.skipif(not _nvidia_tools_present(), reason="triton without its NVIDIA backend tools (ptxas, cuobjdump)")
def test_log_scale_kernels_compile_for_sm90_and_sm80_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _COMPILE, str(ROOT / "scripts")], check=False, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    kernels = {(name, cap) for name, cap, *_ in results}
    # int4 decode on both kernels (launch.INT4_SPLIT_NIBBLES on and off)
    assert {(name, cap) for name in ("_decode_kernel", "_decode_split_kernel", "_prefill_kernel") for cap in (90, 80)
            } <= kernels  # fmt: skip
    assert all(spills == 0 and 0 < registers <= 255 for _, _, registers, spills, _ in results)
