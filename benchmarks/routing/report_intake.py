"""What the Ray adapter pays per request to take its candidates' reports (issue 37, point 5).

    python -m benchmarks.routing.report_intake [--replicas 100] [--blocks 8192 100000] [--repeats 200]

`HfPagedRequestRouter.choose_replicas` calls `_take_report` for every candidate before each choice. Three cases, per
request, for `--replicas` replicas whose summaries hold `--blocks` fingerprints each (CPU time, `time.process_time`):
- unchanged: every summary already taken (the common case): the adapter reads the sequence number, unpacks nothing;
- unpack each: what reading each summary costs when it is unpacked anyway (`CacheSummary.from_stats` per
  candidate, the check the adapter does *not* do first any more);
- all new: every replica sent a new summary since the last request (at most once per stats period per replica).
No Ray cluster: the adapter's methods run on stand-ins for Serve's `RunningReplica` (an id and `routing_stats`).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, field

from benchmarks.common import machine
from hf_paged.scaleout.ray_router import HfPagedRequestRouter
from hf_paged.scaleout.summary import CacheSummary


@dataclass(frozen=True)
class _Id:
    unique_id: str


@dataclass
class _Replica:
    replica_id: _Id
    routing_stats: dict = field(default_factory=dict)


def _stats(seq: int, num_blocks: int, rng: random.Random) -> dict:
    blob = rng.randbytes(8 * num_blocks)
    return CacheSummary(16, blob, num_blocks, 0, seq, time.time()).to_stats()


def measure(num_replicas: int, num_blocks: int, repeats: int) -> dict[str, float]:
    """Milliseconds of CPU per request for each case."""
    rng = random.Random(0)
    router = object.__new__(HfPagedRequestRouter)  # no Serve controller: only the state the adapter's methods use
    router.initialize_state(block_size=16)
    replicas = [_Replica(_Id(str(i)), _stats(1, num_blocks, rng)) for i in range(num_replicas)]
    for replica in replicas:
        router.policy.add_replica(replica.replica_id)
        router._take_report(replica)
    t0 = time.process_time()
    for _ in range(repeats):
        for replica in replicas:
            router._take_report(replica)
    unchanged = (time.process_time() - t0) / repeats
    reps = max(1, repeats // 20)
    t0 = time.process_time()
    for _ in range(reps):
        for replica in replicas:
            CacheSummary.from_stats(replica.routing_stats)
    unpack = (time.process_time() - t0) / reps
    rounds = [[_stats(seq, num_blocks, rng) for _ in replicas] for seq in range(2, 2 + max(1, reps // 2))]
    t0 = time.process_time()
    for fresh in rounds:
        for replica, stats in zip(replicas, fresh):
            replica.routing_stats = stats
            router._take_report(replica)
    new = (time.process_time() - t0) / len(rounds)
    return {"unchanged": unchanged * 1e3, "unpack each": unpack * 1e3, "all new": new * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--blocks", type=int, nargs="+", default=[8192, 100_000])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    print(f"machine: {machine()}\n")
    print("| replicas | blocks a summary | unchanged: ms a request | unpack each: ms a request | all new: ms a request |")
    print("|---|---|---|---|---|")
    for num_blocks in args.blocks:
        ms = measure(args.replicas, num_blocks, args.repeats)
        print(f"| {args.replicas} | {num_blocks:,} | {ms['unchanged']:.3f} | {ms['unpack each']:.2f} | "
              f"{ms['all new']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
