"""What the disk tier's model fingerprint costs: every value read (`kv_transfer/weights_checksum.py`) against the
512-sample fingerprint it replaced and against hashing the bytes with blake2b. CPU time per GB of weights, runs
interleaved, medians.

    OMP_NUM_THREADS=1 python benchmarks/kv_fingerprint_cost.py --repeats 5
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import platform
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged.kv_transfer import model_fingerprint


def sampled_fingerprint(model) -> str:
    """The fingerprint before (512 strided values per tensor), for comparison."""
    h = hashlib.blake2b(digest_size=16)
    for name, p in itertools.chain(model.named_parameters(), model.named_buffers()):
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 512)][:512].contiguous()
        h.update(name.encode() + sample.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def blake2b_bytes(model) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in itertools.chain(model.parameters(), model.buffers()):
        h.update(p.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"(1 thread), load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
                          num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=4)
        model = LlamaForCausalLM(cfg).to(dtype).eval()
        gb = sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers())) / 1e9
        ways = {"512 samples (before)": sampled_fingerprint, "every value (now)": model_fingerprint,
                "blake2b of the bytes": blake2b_bytes}
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(args.repeats):
            for name, fn in ways.items():  # interleaved
                start = time.process_time()
                fn(model)
                times[name].append(time.process_time() - start)
        print(f"\n{str(dtype).removeprefix('torch.')}: {gb:.3f} GB of weights ({args.layers} layers, hidden "
              f"{args.hidden}, vocab 32000), {args.repeats} interleaved repeats, CPU time")
        print("| fingerprint           | ms (median) | range       | ms per GB |")
        print("|-----------------------|-------------|-------------|-----------|")
        for name, ts in times.items():
            ms = [t * 1e3 for t in ts]
            print(f"| {name:21s} | {statistics.median(ms):11.0f} | {min(ms):5.0f}-{max(ms):<5.0f} | "
                  f"{statistics.median(ms) / gb:9.0f} |")


if __name__ == "__main__":
    main()
