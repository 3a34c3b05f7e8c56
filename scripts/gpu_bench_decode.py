"""Micro-benchmark of paged decode attention: achieved memory bandwidth against the device's copy bandwidth.

    python scripts/gpu_bench_decode.py --json decode.json            # batch 64, context 4k, Llama-3-8B heads, bf16
    TRITON_INTERPRET=1 python scripts/gpu_bench_decode.py --tiny     # CPU smoke test of this script

    python scripts/gpu_bench_decode.py --kv-format int4 --json decode_int4.json   # fused-dequant variant

Time: the kernels of one call replayed from a CUDA graph (the device's own time, what an engine replaying captured
decode steps pays), and beside it one eager call (argument checks and Python launches included: at small shapes
the host, not the kernel, sets that time).
Bytes counted: every K and V element the batch's contexts hold (read once), plus query and output; for a quantized
cache (`--kv-format int8|fp8|int4`) the bytes actually stored and read (packed data, scales, zero points), so
the bandwidth is comparable and the time shows what quantization saves. Copy bandwidth
is measured with `dst.copy_(src)` on a large buffer and counts bytes read + written, the usual convention (an H200
copies ~4.3 TB/s that way). Acceptance: decode reaches >= 70% of it at batch 64, context 4k.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass

import torch

from hf_paged.cache.compression import BlockFormat
from hf_paged.cache.kernels import FullPrecisionTail, QuantizedKV, paged_decode_attention
from hf_paged.cache.kernels.reference import ref_paged_decode_attention
from hf_paged.cache.kernels.reference_quantized import ref_paged_decode_attention_quantized
from hf_paged.cache.kernels.triton_decode import default_decode_config, paged_decode_attention_triton

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(slots=True)
class DecodeBenchResult:
    """What the report needs from this benchmark."""

    device: str
    shape: str  # batch x context, heads / kv heads x head_dim, dtype, block size, KV format
    launch: str  # the launch config the kernel used
    copy_bytes_per_s: float  # device copy bandwidth, read + write
    decode_ms: float  # median time of the kernels of one call (CUDA graph replays on a GPU: no host launch cost)
    call_ms: float  # median time of one eager call, the host's argument checks and launches included
    decode_bytes: int  # bytes the call must move
    decode_bytes_per_s: float
    fraction_of_copy: float
    reference_ms: float  # the torch reference on the same inputs (gather + SDPA)
    max_abs_err: float  # Triton vs torch reference on the first sequences


def time_ms(fn, *, warmup: int, iters: int, device: torch.device) -> float:
    """Median milliseconds of fn() (CUDA events on GPU, perf_counter elsewhere)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return samples[len(samples) // 2]


def graph_ms(fn, *, warmup: int, iters: int, device: torch.device, replays: int = 10) -> float:
    """Median milliseconds of the kernels `fn` launches, replayed from a CUDA graph `replays` times between two
    events: the device's own time, as an engine that replays captured decode steps pays it; elsewhere `time_ms`."""
    if device.type != "cuda":
        return time_ms(fn, warmup=warmup, iters=iters, device=device)
    for _ in range(max(warmup, 1)):  # compiles before the capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / replays)
    samples.sort()
    return samples[len(samples) // 2]


def copy_bandwidth(nbytes: int, device: torch.device, iters: int) -> float:
    """Bytes read + written per second by a device-to-device copy of `nbytes`."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup=3, iters=iters, device=device)
    return 2 * nbytes / (ms / 1e3)


def decode_bytes(context_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, elem: int) -> int:
    """K and V of every context position, plus the query read and the output written."""
    kv = 2 * sum(context_lens) * num_kv_heads * head_dim * elem
    return kv + 2 * len(context_lens) * num_heads * head_dim * elem


def build_inputs(args, device: torch.device):
    """Caches filled with random values, each sequence's blocks scattered by a random permutation."""
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device="cpu").manual_seed(0)
    blocks_per_seq = math.ceil(args.context / args.block_size)
    num_blocks = args.batch * blocks_per_seq + 1
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
    key_cache = torch.randn(shape, dtype=dtype, device=device)
    value_cache = torch.randn(shape, dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, generator=gen)[: args.batch * blocks_per_seq]
    block_tables = perm.view(args.batch, blocks_per_seq).to(torch.int32).to(device)
    context_lens = torch.full((args.batch,), args.context, dtype=torch.int32, device=device)
    query = torch.randn(args.batch, args.heads, args.head_dim, dtype=dtype, device=device)
    return query, key_cache, value_cache, block_tables, context_lens


def quantize_inputs(fmt: str, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor):
    """(key, value, tail, bytes per block of K + V): every block quantized (int4 keys per channel, KIVI), and a
    one-block tail (a copy of block 0) for a last partial block: none at the default context, 4096 = 256 blocks."""
    caches, per_block = [], 0
    for cache, per_channel in ((key_cache, fmt == "int4"), (value_cache, False)):
        block_format = BlockFormat(fmt, per_channel=per_channel)
        parts = {name: [] for name in block_format.part_shapes(*cache.shape[1:])}
        for chunk in cache.split(4096):  # bounded fp32 temporaries
            for name, t in block_format.quantize(chunk).items():
                parts[name].append(t)
        parts = {name: torch.cat(ts) for name, ts in parts.items()}
        caches.append(QuantizedKV(parts["data"], parts["scale"], fmt, parts.get("zero"), per_channel))
        per_block += block_format.bytes_per_block(*cache.shape[1:], cache.dtype)
    tail_block = key_cache[:1].clone()
    tail = FullPrecisionTail(tail_block, tail_block.clone(), torch.zeros_like(block_tables))
    return caches[0], caches[1], tail, per_block


def run(args, copy: float | None = None, time_reference: bool = True) -> DecodeBenchResult:
    """One shape. `copy`: the copy bandwidth measured already (else measured here); `time_reference`: time the
    torch reference on the whole batch too (the sweep only checks its values on the first sequences)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype]
    query, key_cache, value_cache, block_tables, context_lens = build_inputs(args, device)
    scale = args.head_dim**-0.5
    backend = "triton"
    tail, kv_block_bytes = None, None
    kv_format, _, variant = args.kv_format.partition(":")  # "int8:nofold", "int8:4w": a launch variant
    if kv_format != "auto":
        key_cache, value_cache, tail, kv_block_bytes = quantize_inputs(kv_format, key_cache, value_cache,
                                                                       block_tables)  # fmt: skip
    config = default_decode_config(query, key_cache, value_cache, block_tables)  # what the kernel runs
    if variant:  # "nofold": int8/fp8 tiles dequantized; "4w": 4 warps; "join" / "split": int4 without / with
        # the split-nibble kernel (`triton_int4`)
        config = dataclasses.replace(config, fold_scales=variant != "nofold", split_nibbles=variant != "join",
                                     num_warps=4 if variant == "4w" else config.num_warps)

    def kernel():
        if variant:  # the launch config forced (the public function chooses its own)
            return paged_decode_attention_triton(query, key_cache, value_cache, block_tables, context_lens,
                                                 scale=scale, tail=tail, config=config)
        return paged_decode_attention(
            query, key_cache, value_cache, block_tables, context_lens, scale=scale, tail=tail, backend=backend
        )

    def reference(n):
        if tail is None:
            return ref_paged_decode_attention(query[:n], key_cache, value_cache, block_tables[:n], context_lens[:n],
                                              scale=scale)  # fmt: skip
        n_tail = FullPrecisionTail(tail.key, tail.value, tail.block_tables[:n])
        return ref_paged_decode_attention_quantized(query[:n], key_cache, value_cache, block_tables[:n],
                                                    context_lens[:n], scale=scale, tail=n_tail)  # fmt: skip

    n_check = min(4 if time_reference else 2, args.batch)
    err = (kernel()[:n_check].float() - reference(n_check).float()).abs().max().item()
    call_ms = time_ms(kernel, warmup=args.warmup, iters=args.iters, device=device)
    replays = max(1, min(10, int(20.0 / max(call_ms, 1e-3))))  # ~20 ms a sample: slow shapes stay quick to time
    ms = graph_ms(kernel, warmup=1, iters=args.iters, device=device, replays=replays)
    ref_ms = time_ms(lambda: reference(args.batch), warmup=1, iters=3, device=device) if time_reference else 0.0
    nbytes = decode_bytes(context_lens.tolist(), args.heads, args.kv_heads, args.head_dim, dtype.itemsize)
    if kv_block_bytes is not None:  # what the quantized cache holds for these contexts, instead of 2 x elements
        kv_plain = decode_bytes(context_lens.tolist(), 0, args.kv_heads, args.head_dim, dtype.itemsize)
        blocks = sum(math.ceil(c / args.block_size) for c in context_lens.tolist())
        nbytes += blocks * kv_block_bytes - kv_plain
    copy = copy or copy_bandwidth(args.copy_bytes, device, iters=args.iters)
    fold = " fold" if kv_format in ("int8", "fp8") and config.fold_scales else ""
    fold += " split" if kv_format == "int4" and config.split_nibbles and args.head_dim >= 32 else ""
    achieved = nbytes / (ms / 1e3)
    return DecodeBenchResult(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)",
        shape=f"b{args.batch} x ctx {args.context}, {args.heads}/{args.kv_heads} heads x {args.head_dim}, "
        f"{args.dtype}, block {args.block_size}, KV {args.kv_format}",
        launch=f"BLOCK_N={config.block_n} splits={config.num_splits} warps={config.num_warps}{fold}",
        copy_bytes_per_s=copy,
        decode_ms=ms,
        call_ms=call_ms,
        decode_bytes=nbytes,
        decode_bytes_per_s=achieved,
        fraction_of_copy=achieved / copy,
        reference_ms=ref_ms,
        max_abs_err=err,
    )


SWEEP_BATCHES = (1, 8, 32, 64, 256)
SWEEP_CONTEXTS = (512, 4096, 32768)
SWEEP_FORMATS = ("auto", "int8", "int4")
# launch variants, at the shapes of the acceptance (batch >= 64, context >= 4k): int8/fp8 per token with the
# scales folded out of the tiles (the default) or not, 8 warps (the quantized default) or 4, fp8; int4 (the "int4"
# rows' layout: keys per channel, values per token) on the split-nibble kernel ("int4:split"; "int4:4w" on 4 warps
# instead of the quantized 8) and on the joined tiles ("int4:join"), whatever `launch.INT4_SPLIT_NIBBLES` says, so
# one run decides that default
VARIANTS = ("int8:nofold", "int8:4w", "fp8", "fp8:nofold", "int4:join", "int4:split", "int4:4w")
VARIANT_BATCHES, VARIANT_CONTEXTS = (64, 256), (4096, 32768)


def sweep(args) -> list[DecodeBenchResult]:
    """Every (KV format, batch, context) of the grid whose full-precision K + V fit in `--max-kv-bytes`, the copy
    bandwidth measured once; one table row each. Shapes that fail are printed and skipped (the rest still run)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    copy = copy_bandwidth(args.copy_bytes, device, iters=args.iters)
    results, elem = [], DTYPES[args.dtype].itemsize
    batches, contexts = (SWEEP_BATCHES, SWEEP_CONTEXTS) if not args.tiny else ((1, 2), (40, 72))
    print(f"| KV | batch | context | kernels ms | TB/s | of copy ({copy / 1e12:.2f} TB/s) | eager call ms | launch "
          "| max err |")
    print("|---|---|---|---|---|---|---|---|---|")
    grid = [(fmt, b, c) for fmt in SWEEP_FORMATS for b in batches for c in contexts]
    if not args.tiny:
        grid += [(fmt, b, c) for fmt in VARIANTS for b in VARIANT_BATCHES for c in VARIANT_CONTEXTS]
    else:
        grid += [(fmt, batches[-1], contexts[-1]) for fmt in VARIANTS if not fmt.startswith("fp8")]
    for fmt, batch, context in grid:
        if 2 * batch * context * args.kv_heads * args.head_dim * elem > args.max_kv_bytes:
            continue
        shape = argparse.Namespace(**{**vars(args), "batch": batch, "context": context, "kv_format": fmt})
        try:
            r = run(shape, copy=copy, time_reference=False)
        except Exception as exc:  # noqa: BLE001 - one failing shape must not hide the others
            print(f"| {fmt} | {batch} | {context} | failed: {type(exc).__name__}: {exc} ||||||")
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results.append(r)
        print(f"| {fmt if fmt != 'auto' else args.dtype} | {batch} | {context} | {r.decode_ms:.3f} | "
              f"{r.decode_bytes_per_s / 1e12:.2f} | {r.fraction_of_copy:.0%} | {r.call_ms:.3f} | {r.launch} | "
              f"{r.max_abs_err:.1e} |", flush=True)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--kv-format", choices=["auto", "int8", "fp8", "int4", *VARIANTS], default="auto",
                   help="cache format: auto (the dtype) or quantized blocks read by the fused-dequant kernel")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--copy-bytes", type=int, default=2 << 30)
    p.add_argument("--sweep", action="store_true",
                   help="batch 1-256 x context 512-32k x KV bf16/int8/int4 (skipping K + V past --max-kv-bytes)")
    p.add_argument("--max-kv-bytes", type=float, default=9e9)
    p.add_argument("--tiny", action="store_true", help="tiny fp32 shapes: a CPU smoke test of this script")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    if args.tiny:
        args.batch, args.context, args.heads, args.kv_heads, args.head_dim = 2, 40, 4, 2, 32  # 32: int4 splits
        args.dtype, args.warmup, args.iters, args.copy_bytes = "fp32", 0, 1, 1 << 20
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = [asdict(r) for r in sweep(args)] if args.sweep else asdict(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
