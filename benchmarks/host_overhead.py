"""The engine's per-step host work at long contexts and long queues: what each step's bookkeeping costs on the
engine's thread (every request in the batch waits for it), done the way the engine does it now beside the way it
did it before session 22, side by side in one process, CPU time (`time.process_time`, best of `--repeats`).

    insert      a running request's prefix-cache inserts, one per filled block, over its whole length:
                from the root each time (before) vs past its own blocks (`RadixCache.insert(known=)`)
    tables      a step's block tables for a batch: every table's Python ints converted (before) vs copied from
                the block manager's int32 rows (`KVCacheManager.table_row`)
    waiting     one step's reads of the waiting queue: each request's cached prefix and whether its next block is
                in flight, walked from the root with the set of every prefill's blocks to compute (before) vs
                resumed walks (`PrefixPolicy`) and blocks asked by index (`InFlight`), a step after the first

    python benchmarks/host_overhead.py --out benchmarks/host_overhead_results.md
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.json_schema import machine
from hf_paged.batching.prefix_policy import PrefixPolicy
from hf_paged.batching.request import Request
from hf_paged.batching.sampling import SamplingParams
from hf_paged.batching.step_inputs import _block_tables
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.radix import RadixCache

BS = 16


def _pair(fn, args: tuple, repeats: int) -> tuple[float, float]:
    """Best CPU seconds of `fn(*args, False)` (before) and `fn(*args, True)` (now), alternated `repeats` times (each
    run on fresh state `fn` builds itself)."""
    before, now = [], []
    for _ in range(repeats):
        before.append(fn(*args, False))
        now.append(fn(*args, True))
    return min(before), min(now)


def inserts(tokens: int, hinted: bool) -> float:
    pool = BlockPool(tokens // BS + 8)
    cache = RadixCache(pool, BS)
    ids = [random.randrange(50_000) for _ in range(tokens)]
    table = pool.allocate(tokens // BS)
    start = time.process_time()
    for full in range(1, tokens // BS + 1):
        cache.insert(ids[: full * BS], table[:full], known=full - 1 if hinted else 0)
    return time.process_time() - start


def tables(batch: int, blocks: int, rows: bool) -> float:
    kv = KVCacheManager(BlockPool(batch * blocks + 8), BS)
    for i in range(batch):
        kv.add_sequence(i)
        kv.allocate_slots(i, blocks * BS)
    lists = [kv.block_ids(i) for i in range(batch)]
    [kv.table_row(i) for i in range(batch)]  # (the rows as a running batch has them: extended as blocks came)
    start = time.process_time()
    for _ in range(10):
        if rows:
            _block_tables([kv.table_row(i) for i in range(batch)])
        else:  # before: each table's ints converted again
            out = np.zeros((batch, max(len(t) for t in lists)), dtype=np.int32)
            for row, table in zip(out, lists):
                row[: len(table)] = table
    return (time.process_time() - start) / 10


def waiting(num_waiting: int, prompt: int, shared: int, prefills: int, prefill_blocks: int, resumed: bool) -> float:
    pool = BlockPool(shared // BS + 8)
    cache = RadixCache(pool, BS)
    system = [random.randrange(50_000) for _ in range(shared)]
    cache.insert(system, pool.allocate(shared // BS))
    policy = PrefixPolicy(cache, BS, lambda request: ())
    queue = [Request(f"w{i}", system + [random.randrange(50_000) for _ in range(prompt - shared)], SamplingParams())
             for i in range(num_waiting)]
    running = []
    for i in range(prefills):
        request = Request(f"p{i}", [random.randrange(50_000) for _ in range(prefill_blocks * BS + 1)], SamplingParams())
        request.num_computed_tokens = BS
        running.append(request)
    for request in queue + running:
        policy.digests(request)  # computed once a request, as the engine does: not part of a step
    if resumed:
        inflight = policy.inflight(running)
        for request in queue:  # the first step's walks
            policy.cached_prefix_len(request)
            policy.should_wait(request, inflight)
    start = time.process_time()
    if resumed:
        inflight = policy.inflight(running)
        for request in queue:
            policy.cached_prefix_len(request)
            policy.should_wait(request, inflight)
    else:  # before: walks from the root, the set of every block to compute
        every = {d for r in running for d in policy.digests(r)[r.num_computed_tokens // BS :]}
        for request in queue:
            cache.peek(request.all_token_ids[:-1], (), request.prompt_digests)
            cache.is_inflight(request.all_token_ids[:-1], (), every, request.prompt_digests)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    random.seed(0)
    cases = [("insert", f"one request grown to {t:,} tokens ({t // BS:,} inserts)", inserts, (t,))
             for t in (2048, 8192, 32768)]
    cases += [("tables", f"{b} sequences of {n:,} blocks, a step", tables, (b, n))
              for b, n in ((64, 128), (64, 2048), (256, 512))]
    cases += [("waiting", (f"{w} waiting prompts of {p:,} tokens on a cached {s:,}-token prefix, {f} prefills with "
                           f"{n:,} blocks to go, a step"), waiting, (w, p, s, f, n))
              for w, p, s, f, n in ((64, 1024, 512, 4, 32), (256, 4096, 2048, 32, 6000))]
    rows = [(kind, case, *_pair(fn, fn_args, args.repeats)) for kind, case, fn, fn_args in cases]
    lines = ["# Host work per step at long contexts and long queues", "",
             (f"Machine: {machine()}. Command: `python benchmarks/host_overhead.py {' '.join(sys.argv[1:])}`. "
              f"Block size {BS}; CPU ms, best of {args.repeats}, before and now alternated."), "",
             "| work | case | before (ms) | now (ms) | before / now |", "|---|---|---:|---:|---:|"]
    lines += [f"| {kind} | {case} | {b * 1e3:.2f} | {n * 1e3:.2f} | {b / n:.1f}x |" for kind, case, b, n in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
