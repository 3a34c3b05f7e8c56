"""Block size and pool pages (issue 41, point 4), measured before any rule is adopted.

Block sizes: the engine on two model shapes x three workloads, block sizes 8/16/32/64 plus what the design's rule
of thumb (L2 size / (2 x d_model), `cache/block_size.py`) gives, all in one run, interleaved, best of `--repeats`
by process CPU time (one torch thread). Every block size holds the same number of token slots (`--slots`), so the
pool is the same size in bytes. Reported per run: tokens per CPU second (prompt + generated tokens processed),
prefix hit rate, fragmentation (slots of live block tables allocated but not holding a token, averaged over the
steps, as a share of the allocated slots), peak blocks used, and whether the outputs equal block 16's.

    python benchmarks/block_size.py --repeats 2            # the block-size table (~10 minutes on 2 busy cores)
    python benchmarks/block_size.py --pages --repeats 5    # first touch and steady state with / without huge pages

Pages: a pool from `cache/huge_pages.py` (2 MiB-aligned, MADV_HUGEPAGE) against plain `torch.empty`: the CPU time of
allocating and writing a `--pool-mib` pool once (first touch), and the engine's CPU time on the ragged workload with
its pool's storage taken from each (steady state: the pool touched before the timed run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.throughput import small_llama
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.block_size import machine_cache_bytes, rule_of_thumb
from hf_paged.cache.huge_pages import huge_pages_in_use, pool_empty, thp_mode
from hf_paged.cache.sizing import kv_shape_of
from hf_paged.cli.workloads import multi_turn, next_turn, ragged, shared_prefix

SHAPES = {  # name -> (hidden, layers, kv heads); 8 query heads each
    "A: hidden 256 x 4 layers, 4 KV heads": (256, 4, 4),
    "B: hidden 512 x 2 layers, 2 KV heads": (512, 2, 2),
}


def workloads():
    return {
        "ragged 16 (8-400 tokens, 16-64 new)": ragged(num_prompts=16, max_len=400, min_new=16, max_new=64, seed=0),
        "shared prefix 16 x 500": shared_prefix(num_questions=16, prefix_len=500, max_new=16),
        "multi-turn 6 x 3": multi_turn(num_users=6, num_turns=3, first_len=200, max_new=16),
    }


class Fragmentation:
    """Step listener: allocated-but-unused slots of live block tables, summed over the steps."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.unused, self.allocated = engine, 0, 0

    def __call__(self, _step) -> None:
        kv, bs = self.engine.kv, self.engine.config.block_size
        self.allocated += sum(len(s.block_ids) for s in kv.seqs.values()) * bs
        self.unused += kv.num_unused_slots()

    @property
    def share(self) -> float:
        return self.unused / self.allocated if self.allocated else 0.0


def run_engine(model, work, config: PagedConfig, prepare=None) -> dict:
    engine = Engine(model, config)
    if prepare is not None:
        prepare(engine)
    warm = engine.add_request(work.prompts[0][:8], SamplingParams(max_new_tokens=2))  # kernels, storage: untimed
    engine.run([warm])
    engine.reset_prefix_cache()
    frag = Fragmentation(engine)
    engine.add_step_listener(frag)
    before = engine.stats()
    cpu = time.process_time()
    prompts, news = work.prompts, work.max_new_tokens
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, news)]
    outs = engine.run(ids)
    answers = [outs[i].generated_tokens for i in ids]
    for turn in range(len(work.messages[0]) if work.messages else 0):
        prompts = [next_turn(p, a, m[turn]) for p, a, m in zip(prompts, answers, work.messages)]
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, news)]
        outs = engine.run(ids)
        answers += [outs[i].generated_tokens for i in ids]
    cpu = time.process_time() - cpu
    stats = engine.stats()
    prompt = stats["prompt_tokens"] - before["prompt_tokens"]
    cached = stats["prompt_tokens_cached"] - before["prompt_tokens_cached"]
    processed = prompt + stats["generated_tokens"] - before["generated_tokens"]
    return {"cpu": cpu, "tokens_per_cpu_s": processed / cpu, "hit_rate": cached / prompt if prompt else 0.0,
            "fragmentation": frag.share, "peak_blocks": stats["peak_blocks_used"], "outputs": answers}


def block_sizes(args) -> None:
    print(f"machine: {machine()}\nL2 per core: {machine_cache_bytes('cpu')} bytes; pool: {args.slots} token slots "
          f"for every block size; budget {args.budget} tokens, max_num_seqs 64; fp32, 1 torch thread")
    rows = []
    for shape_name, (hidden, layers, kv_heads) in SHAPES.items():
        model = small_llama(1000, hidden, layers, kv_heads)
        rule = rule_of_thumb(kv_shape_of(model.config), hidden, torch.float32, machine_cache_bytes("cpu"))
        sizes = sorted({8, 16, 32, 64, rule})
        for work_name, work in workloads().items():
            best: dict[int, dict] = {}
            for _ in range(args.repeats):
                for bs in sizes:  # interleaved: every block size sees the same machine
                    cfg = PagedConfig(block_size=bs, num_blocks=args.slots // bs, max_num_batched_tokens=args.budget,
                                      max_num_seqs=64)
                    r = run_engine(model, work, cfg)
                    if bs not in best or r["cpu"] < best[bs]["cpu"]:
                        r["cpus"] = [*best.get(bs, {}).get("cpus", []), r["cpu"]]
                        best[bs] = r
                    else:
                        best[bs]["cpus"].append(r["cpu"])
            base = best[16]
            for bs in sizes:
                r = best[bs]
                spread = max(r["cpus"]) / min(r["cpus"])
                rows.append([shape_name[:1], work_name, f"{bs}{' (rule)' if bs == rule else ''}",
                             f"{r['tokens_per_cpu_s']:.0f}", f"{r['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f}x",
                             f"{spread:.2f}", f"{r['hit_rate']:.1%}", f"{r['fragmentation']:.1%}", r["peak_blocks"],
                             "yes" if r["outputs"] == base["outputs"] else "NO"])
            print_table(["shape", "workload", "block size", "tokens / CPU s", "vs 16", "max/min CPU", "hit rate",
                         "fragmentation", "peak blocks", "same outputs as 16"], rows[-len(sizes):])
    print_table(["shape", "workload", "block size", "tokens / CPU s", "vs 16", "max/min CPU", "hit rate",
                 "fragmentation", "peak blocks", "same outputs as 16"], rows,
                title=f"\nblock sizes (best of {args.repeats} by process CPU time; shapes: {', '.join(SHAPES)})")


# -- pages ---------------------------------------------------------------------------------------------------
def first_touch(huge: bool, mib: int) -> dict:
    """Allocate a pool of `mib` MiB and write all of it once (fresh memory from the kernel: both ways map it anew,
    glibc's `torch.empty` of this size is an mmap too, and both are unmapped when freed)."""
    shape = (mib * 2**20 // (16 * 4 * 32 * 4), 16, 4, 32)
    start = time.process_time()
    pool, how = pool_empty(shape, torch.float32, huge_pages=huge)
    pool.fill_(0.0)
    cpu = time.process_time() - start
    huge_bytes = huge_pages_in_use()
    del pool
    return {"cpu": cpu, "huge_bytes": huge_bytes, "requested": how.huge_pages_requested}


def steady(model, huge: bool, mib: int, budget: int) -> dict:
    """The engine's CPU time on the ragged workload with its pool's storage from `pool_empty` (touched once before the
    timed run, so only the steady state is timed)."""
    shape = kv_shape_of(model.config)
    num_blocks = mib * 2**20 // shape.bytes_per_block(16, torch.float32)

    def prepare(engine: Engine) -> None:
        for layer in engine.cache.block_layers:
            dims = (num_blocks, 16, shape.num_kv_heads, shape.head_dim)
            layer.key_cache = pool_empty(dims, torch.float32, huge_pages=huge)[0].zero_()
            layer.value_cache = pool_empty(dims, torch.float32, huge_pages=huge)[0].zero_()
            layer.device, layer.is_initialized = torch.device("cpu"), True

    work = ragged(num_prompts=16, max_len=400, min_new=16, max_new=64, seed=0)
    r = run_engine(model, work, PagedConfig(block_size=16, num_blocks=num_blocks, max_num_batched_tokens=budget,
                                            max_num_seqs=64), prepare)
    r["huge_bytes"] = huge_pages_in_use()
    return r


HEADERS = ["measurement", "pool memory", "CPU ms (median)", "CPU ms (mean)", "each run, in order",
           "median vs plain", "mean vs plain", "AnonHugePages MiB (process, max)", "same outputs"]


def pages(args) -> None:
    print(f"machine: {machine()}\ntransparent huge pages (/sys/kernel/mm/transparent_hugepage/enabled): "
          f"{thp_mode()}; with and without alternated in one process, {args.repeats} times each")
    model = small_llama(1000, 256, 4, 4)
    rows = []
    for mode in ("touch", "steady"):
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for _ in range(args.repeats):
            for huge in (False, True):
                runs[huge].append(first_touch(huge, args.pool_mib) if mode == "touch"
                                  else steady(model, huge, args.pool_mib, args.budget))
        base = statistics.median(r["cpu"] for r in runs[False])
        base_mean = statistics.mean(r["cpu"] for r in runs[False])
        for huge in (False, True):
            cpus = [r["cpu"] for r in runs[huge]]
            median = statistics.median(cpus)
            what = f"first touch of {args.pool_mib} MiB" if mode == "touch" else (
                f"engine steady state, ragged 16, pool {args.pool_mib} MiB in all")
            same = "-" if mode == "touch" else (
                "yes" if all(r["outputs"] == runs[False][0]["outputs"] for r in runs[huge]) else "NO")
            huge_mib = max((r["huge_bytes"] or 0) for r in runs[huge]) / 2**20
            mean = statistics.mean(cpus)
            rows.append([what, "THP requested" if huge else "plain", f"{median * 1000:.1f}", f"{mean * 1000:.1f}",
                         " / ".join(f"{c * 1000:.0f}" for c in cpus), f"{median / base:.2f}x",
                         f"{mean / base_mean:.2f}x", f"{huge_mib:.0f}", same])
        print_table(HEADERS, rows[-2:])
    print_table(HEADERS, rows,
                title=f"\npool pages ({args.repeats} runs each, alternated)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16384, help="token slots of the pool (num_blocks x block_size)")
    parser.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--pages", action="store_true", help="huge pages: first touch and steady state")
    parser.add_argument("--pool-mib", type=int, default=256, help="pool size of the --pages runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.pages:
        pages(args)
    else:
        block_sizes(args)


if __name__ == "__main__":
    main()
