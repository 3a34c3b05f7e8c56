"""Compile the Triton kernels for a GPU target on a machine without a GPU, and check registers, spills, shared memory.

    python scripts/gpu_compile_check.py                  # sm_90 (H100/H200) and sm_80 (A100), all scenarios
    python scripts/gpu_compile_check.py --quick --json r.json

The interpreter runs the kernels' Python, not their compilation: it accepts code the compiler rejects (loop-carried
type changes, dot shapes) and says nothing of registers or spills. This script builds each launch exactly as the
launchers do (`decode_launches`, `prefill_launch`, `store_launch`, on meta tensors of real model shapes), mimics the
JIT's argument specialisation (16-byte aligned pointers, ints divisible by 16, ints equal to 1), compiles through
Triton's NVIDIA backend (its bundled ptxas) and reads the cubin's resource usage. Fails on a compile error, any
spill (local memory / stack), or shared memory over the target's per-block limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

os.environ.pop("TRITON_INTERPRET", None)  # compiled-mode kernels; must precede the first @triton.jit

import torch

from hf_paged.cache.kernels.launch import decode_launch_config
from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV
from hf_paged.cache.kernels.triton_decode import decode_launches
from hf_paged.cache.kernels.triton_prefill import prefill_launch
from hf_paged.cache.kernels.triton_store import store_launch

NUM_SMS = 132  # an H100 / H200: the split-K heuristic then splits batch 64 x 4k in two (the merge kernel runs)
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}  # opt-in shared memory per block
POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
           torch.int64: "*i64", torch.int8: "*i8", torch.uint8: "*u8", torch.float8_e4m3fn: "*fp8e4nv"}  # fmt: skip


@dataclass(slots=True)
class CompileResult:
    scenario: str
    kernel: str
    capability: int
    registers: int
    spill_bytes: int  # stack + local memory per thread: 0 expected
    shared_bytes: int
    seconds: float
    ok: bool
    error: str | None = None


def specialise(launch) -> tuple[dict, dict, dict]:
    """Signature, constexprs and attributes as Triton's JIT would derive them from these arguments."""
    fn = launch.kernel
    runtime_names = [n for n in fn.arg_names if n not in launch.constexprs]
    signature, constexprs, attrs = {}, dict(launch.constexprs), {}
    plain = {fn.arg_names[a] if isinstance(a, int) else a for a in getattr(fn, "do_not_specialize", ()) or ()}
    for name, value in zip(runtime_names, launch.args, strict=True):
        index = (fn.arg_names.index(name),)
        if name in plain and not isinstance(value, (torch.Tensor, float)):  # do_not_specialize: a plain int
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            continue
        if isinstance(value, torch.Tensor):
            signature[name] = POINTER[value.dtype]
            if value.data_ptr() % 16 == 0:  # meta tensors report 0: aligned, like any fresh CUDA allocation
                attrs[index] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif isinstance(value, bool) or value == 1:
            signature[name], constexprs[name] = "constexpr", value
        else:
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[index] = [["tt.divisibility", 16]]
    for name in launch.constexprs:
        signature[name] = "constexpr"
    return {n: signature[n] for n in fn.arg_names}, constexprs, attrs


def compile_launch(launch, capability: int) -> tuple[int, int, int]:
    """(registers, spill bytes, shared bytes) of `launch` compiled for sm_<capability>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constexprs, attrs = specialise(launch)
    compiled = triton.compile(
        ASTSource(launch.kernel, signature, constexprs, attrs),
        target=GPUTarget("cuda", capability, 32),
        options={"num_warps": launch.num_warps, "num_stages": launch.num_stages},
    )
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return (
        int(fields["REG"]),
        int(fields["STACK"]) + int(fields["LOCAL"]),
        compiled.metadata.shared + int(fields["SHARED"]),
    )


def scenarios(quick: bool):
    """(name, [launches]) for real model shapes; meta tensors, so nothing is allocated."""
    meta = torch.device("meta")
    # name, heads, kv heads, head_dim, dtype, batch, context, sliding windows
    shapes = [
        ("llama3-8b bf16", 32, 8, 128, torch.bfloat16, 64, 4096, (None, 4096)),
        ("qwen2-7b fp16 (group 7)", 28, 4, 128, torch.float16, 64, 4096, (None,)),
    ]
    if not quick:
        shapes += [
            ("gemma-2b-like hd256 bf16", 8, 1, 256, torch.bfloat16, 64, 4096, (None, 4096)),
            ("mha hd64 fp16", 16, 16, 64, torch.float16, 64, 4096, (None, 4096)),
            ("one seq, 32k, fp32", 4, 2, 16, torch.float32, 1, 32768, (None, 1)),  # ints equal to 1 specialise
        ]
    for name, heads, kv_heads, head_dim, dtype, batch, context, windows in shapes:
        block_size = 16
        cache = torch.empty(batch * context // block_size + 1, block_size, kv_heads, head_dim, dtype=dtype, device=meta)
        tables = torch.empty(batch, context // block_size, dtype=torch.int32, device=meta)
        lens = torch.empty(batch, dtype=torch.int32, device=meta)
        query = torch.empty(batch, heads, head_dim, dtype=dtype, device=meta)
        packed = torch.empty(2048, heads, head_dim, dtype=dtype, device=meta)
        qsl = torch.empty(batch + 1, dtype=torch.int32, device=meta)
        for window in windows:
            tag = f"{name}, b{batch} ctx{context}" + (f", window {window}" if window else "")
            config = decode_launch_config(num_seqs=batch, num_heads=heads, num_kv_heads=kv_heads,
                                          head_dim=head_dim, max_context_len=context, dtype=dtype,
                                          num_sms=NUM_SMS)  # fmt: skip
            yield f"decode {tag}", decode_launches(query, cache, cache, tables, lens, torch.empty_like(query),
                                                   scale=0.1, sliding_window=window, config=config)  # fmt: skip
            yield f"prefill {tag}", [prefill_launch(packed, cache, cache, tables, qsl, lens, torch.empty_like(packed),
                                                    scale=0.1, sliding_window=window)]  # fmt: skip
        # quick: int4 only (per-channel key scales and zero points: the most registers of the formats)
        formats = ("int4",) if quick else ("int8", "fp8", "fp8-bytes", "int4")
        for fmt in formats if name.startswith("llama3") else ():
            key, value = quantized_meta(fmt, cache.shape)
            tail = FullPrecisionTail(cache[: 2 * batch], cache[: 2 * batch], tables)
            tag = f"{name} {fmt} KV, b{batch} ctx{context}"
            config = decode_launch_config(num_seqs=batch, num_heads=heads, num_kv_heads=kv_heads,
                                          head_dim=head_dim, max_context_len=context, dtype=dtype,
                                          num_sms=NUM_SMS, quantized=True)  # fmt: skip
            # int4: both decode kernels, whichever launch.INT4_SPLIT_NIBBLES makes the default
            for split in (False, True) if fmt == "int4" else (config.split_nibbles,):
                yield (f"decode {tag}" + (" split" if split else ""),
                       decode_launches(query, key, value, tables, lens, torch.empty_like(query), scale=0.1,
                                       tail=tail, config=dataclasses.replace(config, split_nibbles=split)))
            yield f"prefill {tag}", [prefill_launch(packed, key, value, tables, qsl, lens, torch.empty_like(packed),
                                                    scale=0.1, tail=tail)]  # fmt: skip
        rows = torch.empty(256, kv_heads, head_dim, dtype=dtype, device=meta)
        slots = torch.empty(256, dtype=torch.int64, device=meta)
        yield f"store {name}", [store_launch(rows, rows, cache, cache, slots)]


def quantized_meta(fmt: str, shape) -> tuple[QuantizedKV, QuantizedKV]:
    """(key, value) caches in `fmt` on the meta device (int4: keys per channel, values per token, like KIVI)."""
    meta = torch.device("meta")
    num_blocks, block_size, kv_heads, head_dim = shape
    if fmt == "int4":
        data = torch.empty(num_blocks, block_size, kv_heads, head_dim // 2, dtype=torch.uint8, device=meta)
        channel = torch.empty(num_blocks, kv_heads, head_dim, dtype=torch.float16, device=meta)
        token = torch.empty(num_blocks, block_size, dtype=torch.float16, device=meta)
        return (QuantizedKV(data, channel, "int4", torch.empty_like(channel, dtype=torch.int8), per_channel=True),
                QuantizedKV(data, token, "int4", torch.empty_like(token, dtype=torch.int8)))
    # "fp8-bytes": e4m3 given as uint8, decoded with integer ops (what GPUs before sm_89 run)
    dtype = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "fp8-bytes": torch.uint8}[fmt]
    data = torch.empty(shape, dtype=dtype, device=meta)
    scale = torch.empty(num_blocks, block_size, dtype=torch.float16, device=meta)
    fmt = "fp8" if fmt == "fp8-bytes" else fmt
    return QuantizedKV(data, scale, fmt), QuantizedKV(data, scale, fmt)


def run(capabilities: list[int], quick: bool) -> list[CompileResult]:
    results = []
    for scenario, launches in scenarios(quick):
        for launch in launches:
            for capability in capabilities:
                if " fp8 KV" in scenario and capability < 89:
                    continue  # no fp8 conversion before sm_89: the launchers use the fp8-bytes variant there
                t0 = time.perf_counter()
                kernel = launch.kernel.__name__
                try:
                    registers, spills, shared = compile_launch(launch, capability)
                except Exception as exc:  # noqa: BLE001 - a compile error is a result to report
                    results.append(CompileResult(scenario, kernel, capability, 0, 0, 0, 0.0, False, repr(exc)[:400]))
                    continue
                ok = spills == 0 and shared <= SHARED_LIMIT.get(capability, SHARED_LIMIT[80])
                seconds = time.perf_counter() - t0
                results.append(CompileResult(scenario, kernel, capability, registers, spills, shared, seconds, ok))
                print(f"{'ok  ' if ok else 'FAIL'} sm_{capability} {kernel:16s} {scenario:48s} regs {registers:3d} "
                      f"spill {spills:4d} B  smem {shared / 1024:6.1f} KiB  ({seconds:.1f} s)", flush=True)  # fmt: skip
    return results


def nvidia_tools_present() -> bool:
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return all(os.path.exists(os.path.join(tools, name)) for name in ("ptxas", "cuobjdump"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--capability", type=int, action="append", help="sm_XY as XY; default 90 and 80")
    p.add_argument("--quick", action="store_true", help="two model shapes, no sliding window, int4 the only quantized format")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    capabilities = args.capability or [90, 80]
    if not nvidia_tools_present():
        print("triton has no NVIDIA backend tools (ptxas, cuobjdump) here: nothing compiled")
        return 3
    results = run(capabilities, args.quick)
    for r in results:
        if r.error:
            print(f"FAIL sm_{r.capability} {r.kernel} {r.scenario}: {r.error}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=2)
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} compiled within limits, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
