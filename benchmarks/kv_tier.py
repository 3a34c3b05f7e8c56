"""The disk tier's background work (issue 39 section 3; issue 41 point 3): what the engine's step thread still pays.

A random Llama of ~60M parameters (`benchmarks/latency.py: stall_model`, hidden 512 x 8 layers, 4 KV heads; fp32,
one torch thread, blocks of 16 tokens: 256 KiB a block on disk). Sections (`--section`, default all):

  writes    a stream of distinct prompts through a pool that holds two of them, so every admission evicts the
            previous prompts' blocks into the disk tier. Saves written on the step thread (`write_behind=False`, the
            connector before this change) vs queued to the writer thread (the default now), runs interleaved: the
            engine thread's CPU seconds (`time.thread_time`, the stepping thread only), the step thread's part of
            saving (`kv_transfer_save_seconds`), blocks saved; greedy tokens checked equal.
  prefetch  4 requests whose prefixes sit in the disk tier arrive while 2 others decode, 2 running at a time:
            reads started when a request is first considered for admission (before: once a slot is free) vs when
            it arrives (`prefetch`, the default now); each request's time to first token from its arrival. The store's reads are slowed by a fixed delay per block (0 and 20 ms) to
            stand for a disk slower than this machine's page cache; 0 = the real files only.
  cost      the fetch-vs-recompute model's own measurements on real files (bytes/s of loads, tokens/s of prefill
            steps) and its decision for a 2k-token prefix.

    python benchmarks/kv_tier.py [--section all] [--repeats 3] [--out benchmarks/kv_tier_results.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.latency import stall_model as build_model
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import DirectoryStore, KVConnector

BLOCK = 16
VOCAB = 32000


def prompts_of(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=g).tolist() for _ in range(n)]


def disk_engine(model, directory: str, *, write_behind: bool, **overrides) -> Engine:
    """An engine with the disk tier at `directory`, its saves written on the step thread or by the writer thread."""
    cfg = {"block_size": BLOCK, "num_blocks": 72, "max_num_batched_tokens": 512, "kv_offload_dir": directory,
           "kv_offload_bytes": 2**31, **overrides}
    engine = Engine(model, PagedConfig(**cfg))
    connector = KVConnector(engine.cache, model, DirectoryStore(directory, 2**31), save_on="evict",
                            write_behind=write_behind)
    engine.scheduler.kv_transfer.close()
    engine.scheduler.kv_transfer = connector  # (it registered itself as the prefix tree's sink)
    return engine


def transfer(engine) -> dict:
    return {k.removeprefix("kv_transfer_"): v for k, v in engine.stats().items() if k.startswith("kv_transfer_")}


def drive(engine, prompts, max_new: int) -> tuple[float, list[list[int]]]:
    """Run the prompts two at a time; the stepping thread's CPU seconds and the outputs."""
    outs, cpu = [], 0.0
    for i in range(0, len(prompts), 2):
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new)) for p in prompts[i : i + 2]]
        start = time.thread_time()
        while engine.has_unfinished:
            engine.step()
        cpu += time.thread_time() - start
        outs += [engine.pop_output(r).generated_tokens for r in ids]
    return cpu, outs


def writes_section(model, repeats: int) -> str:
    prompts = prompts_of(12, 496, seed=1)  # 31 full blocks each; the pool (72 blocks) holds two of them
    rows, cpu, saved, step_save, reference = [], {False: [], True: []}, {}, {False: [], True: []}, None
    for _ in range(repeats):
        for behind in (False, True):  # interleaved
            with tempfile.TemporaryDirectory(dir=os.environ.get("KV_BENCH_DIR")) as directory:
                engine = disk_engine(model, directory, write_behind=behind)
                seconds, outs = drive(engine, prompts, max_new=4)
                engine.scheduler.kv_transfer.close()  # flush (not timed: the writer thread's work)
                stats = transfer(engine)
                reference = reference or outs
                assert outs == reference, "greedy tokens changed"
                cpu[behind].append(seconds)
                step_save[behind].append(stats["save_seconds"])
                saved[behind] = (stats["saved_blocks"], stats["save_dropped"], stats["write_seconds"])
    for behind in (False, True):
        label = "writer thread (now)" if behind else "step thread (before)"
        rows.append([label, f"{statistics.median(cpu[behind]):.2f}",
                     f"{min(cpu[behind]):.2f}-{max(cpu[behind]):.2f}",
                     f"{statistics.median(step_save[behind]) * 1000:.0f}", saved[behind][0], saved[behind][1],
                     f"{saved[behind][2] * 1000:.0f}"])
    ratio = [a / b for a, b in zip(cpu[False], cpu[True])]
    table = print_table(["saves written on", "engine thread CPU s (median)", "range", "step thread's saving ms",
                         "blocks saved", "dropped", "writer thread ms"], rows,
                        title=f"writes: 12 prompts of 496 tokens, pool of 72 blocks, {repeats} interleaved runs")
    return table + (f"\nengine-thread CPU before/after, per pair: {', '.join(f'{r:.3f}' for r in ratio)}; step "
                    f"thread's save time {statistics.median(step_save[False]) / max(statistics.median(step_save[True]), 1e-9):.0f}x "
                    "lower\n")


def queue_run(model, directory: str, prompts, busy, *, prefetch: bool, read_ms: float
              ) -> tuple[list[float], float, dict]:
    """Two `busy` requests decoding (prefixes not on disk), then the prompts queued behind them, two running at a
    time; each prompt's time to first token from its arrival, the whole run's seconds, the connector's counters."""
    engine = Engine(model, PagedConfig(block_size=BLOCK, num_blocks=72, max_num_batched_tokens=512, max_num_seqs=2,
                                       kv_offload_dir=directory, kv_offload_bytes=2**31))
    connector = engine.scheduler.kv_transfer
    if not prefetch:  # as before: a read starts when the request is considered for admission
        connector.prefetch = lambda *args, **kwargs: False
    if read_ms:
        inner = connector.saver.store
        get = inner.get

        def slow_get(key):
            time.sleep(read_ms / 1000)
            return get(key)

        inner.get = slow_get
    for p in busy:
        engine.add_request(p, SamplingParams(max_new_tokens=32))
    engine.step()  # the busy requests run: the prompts below wait for their slots
    start = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=8)) for p in prompts]
    first: dict[str, float] = {}
    while engine.has_unfinished:
        engine.step()
        now = time.perf_counter()
        for rid in ids:
            if rid not in first and engine.requests[rid].output_ids:
                first[rid] = now - start
    elapsed = time.perf_counter() - start
    outs = [engine.pop_output(r).generated_tokens for r in ids]
    for rid in [r for r in engine.requests if r not in ids]:
        engine.pop_output(rid)
    stats = transfer(engine)
    stats["outputs"] = outs
    connector.close()
    return [first[r] for r in ids], elapsed, stats


def prefetch_section(model, repeats: int, read_ms_values=(0.0, 20.0)) -> str:
    prompts = prompts_of(4, 497, seed=2)  # 31 full blocks of prefix each (the last token is always computed)
    busy = prompts_of(2, 64, seed=4)
    rows, notes = [], []
    with tempfile.TemporaryDirectory(dir=os.environ.get("KV_BENCH_DIR")) as directory:
        writer = Engine(model, PagedConfig(block_size=BLOCK, num_blocks=300, max_num_batched_tokens=512,
                                           kv_offload_dir=directory, kv_offload_bytes=2**31))
        for p in prompts:
            writer.add_request(p, SamplingParams(max_new_tokens=1))
        reference = [o.generated_tokens for o in writer.run().values()]
        writer.scheduler.kv_transfer.save_cached()
        writer.scheduler.kv_transfer.close()
        for read_ms in read_ms_values:
            ttft: dict[bool, list[list[float]]] = {False: [], True: []}
            wall: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats):
                for prefetch in (False, True):  # interleaved
                    firsts, elapsed, stats = queue_run(model, directory, prompts, busy, prefetch=prefetch,
                                                       read_ms=read_ms)
                    assert [o[:1] for o in stats["outputs"]] == reference, "greedy tokens changed"
                    assert stats["loaded_blocks"] >= 4 * 31, stats["loaded_blocks"]  # (+ the busy ones, 2nd run on)
                    ttft[prefetch].append(firsts)
                    wall[prefetch].append(elapsed)
            for prefetch in (False, True):
                per_run = ttft[prefetch]
                rows.append([f"{read_ms:g}", "on arrival (now)" if prefetch else "at admission (before)",
                             f"{statistics.median(statistics.mean(r) for r in per_run) * 1000:.0f}",
                             f"{statistics.median(max(r) for r in per_run) * 1000:.0f}",
                             f"{statistics.median(wall[prefetch]):.2f}"])
            ratio = [statistics.mean(a) / statistics.mean(b) for a, b in zip(ttft[False], ttft[True])]
            notes.append(f"read delay {read_ms:g} ms/block: mean TTFT before/now per pair "
                         + ", ".join(f"{r:.2f}" for r in ratio))
    table = print_table(["read delay ms/block", "disk reads start", "mean TTFT ms", "last TTFT ms", "run s"], rows,
                        title=f"prefetch: 4 requests (prefix 31 blocks each on disk, 8 new tokens) arrive while 2 "
                              f"others decode 32 tokens; 2 run at a time; {repeats} interleaved runs (medians)")
    return table + "\n" + "\n".join(notes) + "\n"


def cost_section(model, repeats: int) -> str:
    """The cost model's own measurements on real files: prompts computed (prefill steps timed), evicted to disk,
    then asked again (loads timed); its rates and its decision for a 2k-token prefix."""
    prompts = prompts_of(4, 497, seed=3)
    rows = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(dir=os.environ.get("KV_BENCH_DIR")) as directory:
            engine = Engine(model, PagedConfig(block_size=BLOCK, num_blocks=72, max_num_batched_tokens=512,
                                               kv_offload_dir=directory, kv_offload_bytes=2**31))
            first = [o.generated_tokens for o in engine.run([engine.add_request(p, SamplingParams(max_new_tokens=1))
                                                             for p in prompts]).values()]
            again = [o.generated_tokens for o in engine.run([engine.add_request(p, SamplingParams(max_new_tokens=1))
                                                             for p in prompts]).values()]
            assert first == again, "greedy tokens changed"
            stats = transfer(engine)
            engine.scheduler.kv_transfer.close()
            est = engine.scheduler.kv_transfer.cost.estimate(128 * 262_144 + 128 * 1024, 2048)
            rows.append([f"{stats['cost_bandwidth_bytes_per_s'] / 2**20:.0f}", stats["cost_load_samples"],
                         f"{stats['cost_prefill_tokens_per_s']:.0f}", stats["cost_prefill_samples"],
                         stats["loaded_blocks"], f"{est.fetch_seconds * 1000:.0f}",
                         f"{est.recompute_seconds * 1000:.0f}", "load" if est.load_is_cheaper else "recompute",
                         stats["loads_skipped"]])
    return print_table(["loads MiB/s", "samples", "prefill tokens/s", "samples", "blocks loaded",
                        "2k prefix: fetch ms", "recompute ms", "decision", "loads skipped"], rows,
                       title="cost: 4 prompts of 497 tokens through a pool that holds 2 (the first ones go to disk), "
                             "then the same 4 again (real files); one row a run") + "\n"


SECTIONS = {"writes": writes_section, "prefetch": prefetch_section, "cost": cost_section}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=["all", *SECTIONS], default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = build_model()
    chosen = list(SECTIONS) if args.section == "all" else [args.section]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    parts = [SECTIONS[name](model, args.repeats) for name in chosen]
    text = "\n".join(parts)
    if args.out:
        header = (f"# KV tier: background writes, prefetch, cost model\n\n{machine()}, {started}\n\n"
                  f"    OMP_NUM_THREADS=1 python benchmarks/kv_tier.py --section {args.section} "
                  f"--repeats {args.repeats}\n\n```\n")
        Path(args.out).write_text(header + text + "```\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
