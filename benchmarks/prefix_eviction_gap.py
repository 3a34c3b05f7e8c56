"""Where Belady's gain over LRU comes from, and which online policy gets some of it (issue 41, point 3).

Runs `prefix_oracle.simulate` (the block-level model of the prefix cache) on the traces of
`benchmarks/prefix_eviction.py` (its three workloads) and on three it was not designed on (`chat_zipf`: users of
unequal activity and turn counts; `chat` with 24 users x 4 turns and with 6 users x 10 turns; `support_mix`: chat,
documents and one-offs together). The model needs each request's new tokens; here they are 8 seeded random tokens
(the engine's greedy answers only matter as tokens a chat history carries, never for which blocks repeat).

With `--mooncake PATH` (the public Mooncake `conversation_trace.jsonl`, FAST'25 release: 12,031 chat requests of an
hour, 512-token blocks as `hash_ids`), windows of `--mooncake-requests` consecutive requests (window k starts at
request 4,000 k, one a seed) run too: a 512-token block is 16 equal tokens here (block 16), a prompt's partial last
block one token of its own (never a full block, never cached, as in the engine), and answers are not cached (the
trace's next turn names its own blocks for them). Printed beside the table: how long a live block waits for its
first reuse against the LRU pool's turnover, and how the share of new blocks that are ever reused varies with what
is known when they are stored (their request's hit depth, the prompt's length).

Printed: points of hit rate over the model's LRU, mean and worst seed, for the oracles that know part of the future
(`oracle_dead`: only whether a block is used again; `oracle_count`: how often; `oracle`: when) and for the online
policies. Then, for chat: how well what is known online predicts who comes next (a user's turns so far, the gap
since their last turn, their own mean past gap).

    python benchmarks/prefix_eviction_gap.py [--seeds 5] [--policies lru,lru2,window:0.5,...]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.prefix_eviction import (
    BLOCK_SIZE,
    MAX_NEW,
    VOCAB,
    Turn,
    chat,
    chat_zipf,
    docs_bursts,
    shared_docs,
    support_mix,
)
from benchmarks.prefix_oracle import _chains, simulate

WORKLOADS = {  # name -> (trace of a seed, fixed pool or None for 25% / 50% of the working set)
    "docs-bursts": (lambda s: docs_bursts(s, 8), 140),
    "chat": (lambda s: chat(s, 12, 6), None),
    "shared-docs": (lambda s: shared_docs(s, 64), None),
    "chat-zipf*": (lambda s: chat_zipf(s, 16), None),
    "chat-24x4*": (lambda s: chat(s, 24, 4), None),
    "chat-6x10*": (lambda s: chat(s, 6, 10), None),
    "support-mix*": (lambda s: support_mix(s, 72), None),
}
DEFAULT_POLICIES = "lru,lfu,lru2,2q,gap,window:2,window+:1,window+:2,oracle_dead,oracle_count,oracle"


def model_trace(trace: list[Turn], seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts and (random) outputs of a trace, chat histories carrying the outputs like the engine's replay."""
    rng = random.Random(10_000 + seed)
    history: dict[int, list[int]] = {}
    prompts, outputs = [], []
    for turn in trace:
        prompt = history.get(turn.user, []) + turn.tokens if turn.user is not None else turn.tokens
        out = [rng.randrange(VOCAB) for _ in range(MAX_NEW)]
        if turn.user is not None:
            history[turn.user] = prompt + out
        prompts.append(prompt)
        outputs.append(out)
    return prompts, outputs


def working_set(prompts: list[list[int]], outputs: list[list[int]]) -> int:
    """Distinct full blocks the cache would hold with a pool that never evicts."""
    blocks, n = set(), BLOCK_SIZE
    for p, o in zip(prompts, outputs):
        seq, parent = list(p) + list(o)[:-1], None
        for start in range(0, len(seq) - n + 1, n):
            parent = (parent, tuple(seq[start:start + n]))
            blocks.add(hash(parent))
    return len(blocks)


def mooncake(path: str, requests: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Window `seed` of a Mooncake-format trace as the model's prompts and (uncached, one-token) outputs."""
    import itertools
    import json
    with open(path) as f:
        rows = [json.loads(line) for line in itertools.islice(f, 4000 * seed, 4000 * seed + requests)]
    if len(rows) < requests:
        raise ValueError(f"{path} has no {requests} requests from request {4000 * seed} (seed {seed}): use fewer seeds")
    fresh = itertools.count(-1, -1)  # token ids of their own: partial last blocks and answers
    prompts, outputs = [], []
    for row in rows:
        full = row["input_length"] // 512
        prompt = [h for h in row["hash_ids"][:full] for _ in range(BLOCK_SIZE)]
        prompts.append(prompt + ([next(fresh)] if len(row["hash_ids"]) > full else []))
        outputs.append([next(fresh)])
    return prompts, outputs


def live_blocks(prompts: list[list[int]], pool: int) -> str:
    """When live blocks are reused, and whether what is known at store time predicts it (one line)."""
    ids: dict = {}
    chains = _chains(prompts, BLOCK_SIZE, ids)
    uses: dict[int, int] = {}
    for chain in chains:
        for b in chain:
            uses[b] = uses.get(b, 0) + 1
    created: dict[int, int] = {}
    gaps, by_kind = [], {"first turn": [0, 0], "later turn": [0, 0]}
    for i, chain in enumerate(chains):
        hit = next((d for d, b in enumerate(chain) if b not in created), len(chain))
        kind = "first turn" if hit <= 1 else "later turn"  # past the shared first block or not
        for b in chain:
            if b in created:
                if created[b] >= 0:
                    gaps.append(i - created[b])
                    created[b] = -1
            else:
                created[b] = i
                by_kind[kind][0] += 1
                by_kind[kind][1] += uses[b] > 1
    turnover = pool / (len(ids) / len(chains))
    late = sum(g > turnover for g in gaps) / max(1, len(gaps))
    kinds = ", ".join(f"{k} {v[1] / max(1, v[0]):.2f}" for k, v in by_kind.items())
    return f"live blocks reused after one LRU turnover (~{turnover:.0f} requests): {late:.2f}; reused share by {kinds}"


def chat_signals(trace: list[Turn]) -> dict[str, float]:
    """For each chat request after the first few: is the user who comes next the one an online signal ranks first?
    Reported as the mean rank percentile (0 = always ranked first, 0.5 = no better than chance) of the actual next
    user among the users seen so far, for: most turns so far first, fewest turns first, most recent last turn first,
    shortest own mean gap first."""
    last: dict[int, int] = {}
    turns: dict[int, int] = {}
    gaps: dict[int, list[int]] = {}
    scores: dict[str, list[float]] = {"most turns": [], "fewest turns": [], "most recent": [], "shortest mean gap": [],
                                      "least recent": []}
    for i, turn in enumerate(trace):
        u = turn.user
        if u is None:
            continue
        if u in last and len(last) >= 3:
            mean_gap = {v: sum(gaps[v]) / len(gaps[v]) if gaps.get(v) else float("inf") for v in last}
            signals = {"most turns": lambda v: -turns[v], "fewest turns": lambda v: turns[v],
                       "most recent": lambda v: -last[v], "least recent": lambda v: last[v],
                       "shortest mean gap": mean_gap.__getitem__}
            for label, rank in signals.items():
                ranked = sorted(last, key=rank)
                scores[label].append(ranked.index(u) / (len(ranked) - 1))
        if u in last:
            gaps.setdefault(u, []).append(i - last[u])
        last[u] = i
        turns[u] = turns.get(u, 0) + 1
    return {k: sum(v) / len(v) for k, v in scores.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--policies", default=DEFAULT_POLICIES)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--mooncake", help="a Mooncake-format conversation trace (JSONL) to replay too")
    parser.add_argument("--mooncake-requests", type=int, default=1500)
    args = parser.parse_args()
    notes: list[str] = []
    if args.mooncake:
        WORKLOADS["mooncake*"] = (lambda s: mooncake(args.mooncake, args.mooncake_requests, s), None)
        args.workloads += ",mooncake*"
    policies = args.policies.split(",")
    print(f"model: prefix_oracle.simulate, block {BLOCK_SIZE}, {MAX_NEW} new tokens a request; seeds 0..{args.seeds - 1};"
          " * = a workload the policies were not designed on\n")
    print("| workload | pool | lru | " + " | ".join(p for p in policies if p != "lru") + " |")
    print("|---" * (len(policies) + 2) + "|")
    signals: dict[str, list[dict[str, float]]] = {}
    for name in args.workloads.split(","):
        make, fixed = WORKLOADS[name]
        runs: dict[str, dict[str, list[float]]] = {}
        for seed in range(args.seeds):
            trace = make(seed)
            if name.startswith("chat"):
                signals.setdefault(name, []).append(chat_signals(trace))
            prompts, outputs = trace if name == "mooncake*" else model_trace(trace, seed)
            ws = working_set(prompts, outputs)
            floor = max(len(p) + MAX_NEW for p in prompts) // BLOCK_SIZE + 4
            pools = {"140": fixed} if fixed else {s: max(round(f * ws), floor) for s, f in (("25%", .25), ("50%", .5))}
            if name == "mooncake*":
                notes += [f"mooncake* seed {seed}, pool {label}: {live_blocks(prompts, n)}" for label, n in pools.items()]
            for label, blocks in pools.items():
                for p in policies:
                    runs.setdefault(label, {}).setdefault(p, []).append(simulate(prompts, outputs, blocks, p))
        for label, by in runs.items():
            lru = by["lru"]
            cells = []
            for p in policies:
                if p == "lru":
                    continue
                gain = [100 * (a - b) for a, b in zip(by[p], lru)]
                cells.append(f"{sum(gain) / len(gain):+.1f} ({min(gain):+.1f})")
            print(f"| {name} | {label} | {100 * sum(lru) / len(lru):.1f}% | " + " | ".join(cells) + " |", flush=True)
    print("", *notes, sep="\n")
    print("\nchat: where the next user ranks among the users seen so far by an online signal "
          "(mean rank percentile: 0 = ranked first, 0.5 = chance)")
    for name, rows in signals.items():
        keys = rows[0].keys()
        print(f"  {name}: " + ", ".join(f"{k} {sum(r[k] for r in rows) / len(rows):.2f}" for k in keys))


if __name__ == "__main__":
    main()
