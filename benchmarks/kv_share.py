"""Colocated replicas sharing hot prefixes (`--kv-share`, issue 39 s.3): a replica that lacks a prefix a peer holds
loads it through Ray's object store instead of recomputing it.

Two engine replicas of the embedded tiny model (`hf_paged/assets/tiny-lm`, fp32, block size 16), each a Ray actor
with one torch thread, on a real local Ray cluster, wired as `EngineReplica` wires them (`attach_kv_share`).
Requests are forced to a replica (actor calls), not routed, so each trial knows which replica holds what.

  hot prefix -> B    replica A serves each document twice (`doc + q1`, `doc + q2`: the second is a prefix hit, so
                     A publishes the document's blocks); then B, with an empty cache (a replica that just joined or
                     restarted: its prefix cache is reset before each trial), gets `doc + q3`, once with sharing on
                     and once off, the order alternating per document; the first document of each length is a
                     warm-up pair, not counted (whichever arm ran first there paid B's first long forward: 0.94x
                     and 2.4x of the other arm before this warm-up, the outliers of the earlier spreads)
  short prompts      B gets unique 24-token prompts (one full block then the last token's: a lookup happens and
                     misses), alternately with sharing on and off: what sharing costs where it cannot help
  unique long        B gets unique 512-token prompts (every lookup misses), alternately on and off

Measured inside B: TTFT as B's process CPU time (`time.process_time`: the engine thread, the read thread, Ray's
threads in that process) and wall time, from `add_request` to the step that emits the first token; the prefill
tokens B computed (its engine's `computed_tokens`) and loaded (`kv_transfer_loaded_tokens`). Greedy outputs of the
two arms are compared token by token.

    python benchmarks/kv_share.py [--lengths 256 1024] [--docs 4] [--shorts 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.common import machine, print_table

BLOCK_SIZE = 16
MAX_NEW = 4
VOCAB = 256  # the tiny model's byte tokens (BOS/EOS/PAD above)


class BenchReplica:
    """One replica: the tiny model in an engine with the sharing connector (switched off for the other arm)."""

    def __init__(self, directory: str, max_blocks: int) -> None:
        import torch

        from hf_paged import Engine, PagedConfig
        from hf_paged.api.loading import load_model
        from hf_paged.api.models import DEFAULT_MODEL_PATH
        from hf_paged.scaleout.kv_share import attach_kv_share

        torch.set_num_threads(1)
        model, _ = load_model(str(DEFAULT_MODEL_PATH))
        self.engine = Engine(model, PagedConfig(block_size=BLOCK_SIZE, num_blocks=1024))
        self.store = attach_kv_share(self.engine, directory, max_blocks=max_blocks)
        self.connector = self.engine.scheduler.kv_transfer

    def run(self, prompts: list[list[int]]) -> list[list[int]]:
        outs = [self.request(p, share=True)["tokens"] for p in prompts]
        self.store.flush()  # registered with the directory before the driver goes on
        return outs

    def request(self, prompt: list[int], *, share: bool, reset: bool = False) -> dict:
        """Serve one prompt alone; TTFT on this process's CPU clock and on the wall clock."""
        from hf_paged import SamplingParams

        engine = self.engine
        with engine.lock:
            engine.scheduler.kv_transfer = self.connector if share else None  # with / without --kv-share
            if reset:
                engine.kv.prefix_cache.reset()  # a replica that just joined or restarted: nothing cached
        before = engine.stats()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=MAX_NEW))
        ttft = None
        while engine.has_unfinished:
            out = engine.step()
            if ttft is None and (out.new_tokens.get(rid) or any(o.request_id == rid for o in out.finished)):
                ttft = (time.process_time() - cpu0, time.perf_counter() - wall0)
        result = engine.pop_output(rid)
        after = engine.stats()
        tokens = list(result.generated_tokens)
        computed = after["computed_tokens"] - before["computed_tokens"] - (len(tokens) - 1)  # prefill part
        loaded = after.get("kv_transfer_loaded_tokens", 0) - before.get("kv_transfer_loaded_tokens", 0)
        return {"cpu": ttft[0], "wall": ttft[1], "computed": computed, "loaded": loaded, "tokens": tokens}

    def transfer_stats(self) -> dict:
        return {k: v for k, v in self.engine.stats().items() if k.startswith("kv_transfer_")}

    def syncs(self) -> str:
        store = self.connector.hot.store
        return f"{store.num_syncs} ({1e3 / store.sync_seconds.per_second:.2f} ms each, decayed mean)"

    def directory_stats(self) -> dict:
        self.store.flush()
        return self.store.directory_stats()


def random_prompt(rng, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def summarize(name: str, trials: list[dict]) -> list:
    """One table row: medians of each arm, the on/off ratio of TTFT (median of per-pair ratios, and the spread).
    Trials come in pairs (one on, one off, the same document for the hot workloads), in order."""
    on = [t for t in trials if t["share"]]
    off = [t for t in trials if not t["share"]]
    ratios = sorted(a["cpu"] / b["cpu"] for a, b in zip(on, off))
    wall_ratios = sorted(a["wall"] / b["wall"] for a, b in zip(on, off))
    same = "n/a (unique prompts)" if on[0]["tokens"] is None else (
        "yes" if all(a["tokens"] == b["tokens"] for a, b in zip(on, off)) else "NO")
    return [name, len(on), median(t["computed"] for t in off), median(t["computed"] for t in on),
            median(t["loaded"] for t in on), 1e3 * median(t["cpu"] for t in off), 1e3 * median(t["cpu"] for t in on),
            median(ratios), f"{ratios[0]:.2f}-{ratios[-1]:.2f}", median(wall_ratios), same]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024], help="hot document lengths (tokens)")
    parser.add_argument("--docs", type=int, default=4, help="hot documents per length")
    parser.add_argument("--shorts", type=int, default=30, help="short prompts per arm")
    parser.add_argument("--longs", type=int, default=4, help="unique 512-token prompts per arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import random

    import ray

    from hf_paged.scaleout.deploy import worker_env

    ray.init(num_cpus=2, include_dashboard=False, runtime_env=worker_env(), log_to_driver=False)
    rng = random.Random(args.seed)
    actor = ray.remote(BenchReplica).options(num_cpus=0)
    a, b = actor.remote("bench-kv-share", 4096), actor.remote("bench-kv-share", 4096)
    start = time.perf_counter()
    trials: dict[str, list[dict]] = {}
    for length in args.lengths:
        docs = [random_prompt(rng, length) for _ in range(args.docs + 1)]  # the first: a warm-up pair, not kept
        qs = [[random_prompt(rng, 16) for _ in range(3)] for _ in docs]
        ray.get(a.run.remote([d + q for d, q3 in zip(docs, qs) for q in q3[:2]]))  # A: 2nd ask of each is a hit
        runs = []
        for i, (doc, q3) in enumerate(zip(docs, qs)):
            order = (True, False) if i % 2 == 0 else (False, True)
            for share in order:
                r = ray.get(b.request.remote(doc + q3[2], share=share, reset=True))
                runs.append({**r, "share": share})
        trials[f"hot {length}"] = runs[2:]
    for name, count, n in (("short 24", args.shorts, 24), ("unique 512", args.longs, 512)):
        runs = []
        for i in range(count):
            prompts = (random_prompt(rng, n), random_prompt(rng, n))
            order = (True, False) if i % 2 == 0 else (False, True)
            for share, prompt in zip(order, prompts):  # each arm its own unique prompt (no hit either way)
                runs.append({**ray.get(b.request.remote(prompt, share=share)), "share": share, "tokens": None})
        trials[name] = runs
    rows = [summarize(name, runs) for name, runs in trials.items()]
    b_stats, directory = ray.get(b.transfer_stats.remote()), ray.get(b.directory_stats.remote())
    a_stats = ray.get(a.transfer_stats.remote())
    syncs = ray.get(b.syncs.remote())
    elapsed = time.perf_counter() - start
    ray.shutdown()

    headers = ["workload", "pairs", "prefill computed off", "prefill computed on", "loaded on", "TTFT cpu off ms",
               "TTFT cpu on ms", "on/off cpu (median)", "spread", "on/off wall", "tokens equal"]
    table = print_table(headers, rows)
    notes = [
        (f"A published {a_stats['kv_transfer_saved_blocks']} blocks ({a_stats['kv_transfer_saved_bytes']} bytes); "
         f"B loaded {b_stats['kv_transfer_loaded_blocks']} blocks, load failures "
         f"{b_stats['kv_transfer_load_failures']}, loads skipped by the cost model "
         f"{b_stats['kv_transfer_loads_skipped']}"),
        (f"B's cost model: bandwidth {b_stats['kv_transfer_cost_bandwidth_bytes_per_s'] / 1e6:.0f} MB/s "
         f"({b_stats['kv_transfer_cost_load_samples']} loads), prefill "
         f"{b_stats['kv_transfer_cost_prefill_tokens_per_s']:.0f} tokens/s "
         f"({b_stats['kv_transfer_cost_prefill_samples']} steps); B's directory round trips: {syncs}"),
        f"directory: {directory}",
        f"{machine()}; load average {os.getloadavg()[0]:.1f}; {elapsed:.0f} s",
    ]
    for name, runs in trials.items():  # each pair's on/off CPU ratio, in the order run (the spread's outliers)
        if name.startswith("hot"):
            on, off = [t for t in runs if t["share"]], [t for t in runs if not t["share"]]
            notes.append(f"{name} pairs, on/off cpu: " + " ".join(f"{a['cpu'] / b['cpu']:.2f}" for a, b in zip(on, off))
                         + "; on-arm wall ms: " + " ".join(f"{1e3 * a['wall']:.0f}" for a in on))
    text = table + "\n\n" + "\n".join(notes)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
