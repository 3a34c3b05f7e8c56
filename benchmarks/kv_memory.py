"""Resident memory of the KV pool by `kv_cache_dtype`: one fresh process per mode, the same model and requests.

    python benchmarks/kv_memory.py [--modes auto int8 int4]

Each mode loads a random 60M-parameter Llama (hidden 512 x 8 layers, vocabulary 32k), builds an `Engine` with the
default `PagedConfig` but for `kv_cache_dtype`, runs one short request (the pool is created at the first forward),
then 8 ragged requests (90-1500 prompt tokens, 32 new tokens each). RSS from /proc/self/status; peak from
`getrusage`. A pool that is zeroed at creation is resident at once; one created empty is taken as it is written.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return -1


def measure(mode: str) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_paged

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                                         max_position_embeddings=4096)).eval()
    loaded = rss_mb()
    engine = hf_paged.Engine(model, hf_paged.PagedConfig(kv_cache_dtype=mode))
    built = rss_mb()  # before the first request
    engine.run([engine.add_request(list(range(3, 40)), hf_paged.SamplingParams(max_new_tokens=2))])
    first = rss_mb()
    g = torch.Generator().manual_seed(0)
    lengths = (300, 800, 1200, 200, 500, 90, 1500, 700)
    engine.run([engine.add_request(torch.randint(3, 32000, (n,), generator=g).tolist(),
                                   hf_paged.SamplingParams(max_new_tokens=32)) for n in lengths])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    stats = engine.stats()
    return (f"| {mode} | {loaded} | {built} | {first} | {rss_mb()} | {peak} | {stats['blocks_total']} | "
            f"{stats['kv_bytes_allocated'] / 2**20:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=["auto", "int8", "int4"])
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process: measure one mode
    args = parser.parse_args(argv)
    if args.one:
        print(measure(args.one), flush=True)
        return 0
    from benchmarks.common import machine

    print(f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.2f}\ncommand: python benchmarks/kv_memory.py {' '.join(sys.argv[1:])}\n")
    print("| kv_cache_dtype | RSS model loaded MB | engine built, before any request | after the first request "
          "| after 8 ragged requests | peak | blocks | KV allocated MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in args.modes:  # a fresh process each: RSS and its peak never come down within one
        out = subprocess.run([sys.executable, __file__, "--one", mode], capture_output=True, text=True, check=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
