"""Prefix-cache eviction policies side by side (issue 41, point 3): LRU vs LFU vs cost vs slru, embedded model.

Workloads (token ids drawn from a seeded generator; requests run one after another in trace order, so a request's
hits depend only on the policy and the trace, never on batching or timing: hit rates are deterministic):

  docs-bursts  the issue's case: a 140-block pool, two 700-token documents asked about in turn (each time with a
               new 24-token question) between bursts of four 500-token one-off prompts; 8 rounds.
  chat         multi-turn chat: 12 users x 6 turns behind one 128-token system prompt, users in random order;
               turn t's prompt = turn t-1's prompt + its greedy answer + a new 40-120-token message.
  shared-docs  8 documents (300-800 tokens) with Zipf(1) popularity, 64 questions about them mixed with one-off
               prompts (200-500 tokens, 40% of requests), in random order.
  chat-zipf    (added after the policies were designed, as a check) 16 users of Zipf(1) activity, each with its own
               number of turns (1 + a geometric count, mean ~4.5, at most 14), 20-200-token messages.
  support-mix  (likewise) 8 chat users, questions about 4 documents and one-offs mixed, 45/35/20% of 72 requests.

All but docs-bursts run with the pool at 25% and at 50% of their working set (the blocks the prefix cache holds
at the end of the same trace run with a pool that never evicts), each under several seeds. Reported per policy:
prefix hit rate (prompt tokens served from the cache / prompt tokens), prompt tokens computed, tokens (prompt +
new) per CPU second, and CPU seconds relative to LRU's on the same trace (process time, one torch thread, the policies interleaved). Greedy outputs
must be identical across policies (eviction changes only what is recomputed); the run fails if they are not.
The headroom: `prefix_oracle.py` replays the same prompts through a block-level model of the cache under LRU and
under Belady's MIN (furthest next use first, knowing the future): "oracle - lru" is what any policy could gain.

    python benchmarks/prefix_eviction.py [--seeds 3] [--workloads chat,shared-docs,...] [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, print_table
from benchmarks.prefix_oracle import POLICIES as ORACLE_POLICIES
from benchmarks.prefix_oracle import simulate
from hf_paged import Engine, PagedConfig, SamplingParams, default_model

POLICIES = ("lru", "lfu", "cost", "slru")
MODELLED = (*ORACLE_POLICIES, "window+:2")  # window+:2 models "slru"
WORKLOADS = ("docs-bursts", "chat", "shared-docs", "chat-zipf", "support-mix")
BLOCK_SIZE = 16
MAX_NEW = 8
VOCAB = 256  # the embedded model's byte tokens


@dataclass(slots=True)
class Turn:
    """One request of a trace: a fixed prompt, or (chat) a message appended to a user's history."""

    tokens: list[int]
    user: int | None = None  # chat: whose history the tokens extend (history = prompt + answer of the last turn)
    tag: str = ""  # "doc" for document questions (reported apart)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def docs_bursts(seed: int, rounds: int) -> list[Turn]:
    rng = random.Random(seed)
    docs = [tokens(rng, 700), tokens(rng, 700)]
    trace = []
    for r in range(rounds):
        trace.append(Turn(docs[r % 2] + tokens(rng, 24), tag="doc"))
        trace.extend(Turn(tokens(rng, 500)) for _ in range(4))
    return trace


def chat(seed: int, users: int, turns: int) -> list[Turn]:
    rng = random.Random(seed)
    system = tokens(rng, 128)
    order = [u for u in range(users) for _ in range(turns)]
    rng.shuffle(order)
    seen: set[int] = set()
    trace = []
    for u in order:
        first = u not in seen
        seen.add(u)
        trace.append(Turn((system if first else []) + tokens(rng, rng.randrange(40, 121)), user=u))
    return trace


def shared_docs(seed: int, num_requests: int) -> list[Turn]:
    rng = random.Random(seed)
    docs = [tokens(rng, rng.randrange(300, 801)) for _ in range(8)]
    weights = [1 / (k + 1) for k in range(len(docs))]
    trace = []
    for _ in range(num_requests):
        if rng.random() < 0.4:
            trace.append(Turn(tokens(rng, rng.randrange(200, 501))))
        else:
            trace.append(Turn(rng.choices(docs, weights)[0] + tokens(rng, 32), tag="doc"))
    return trace


def chat_zipf(seed: int, users: int) -> list[Turn]:
    """Chat the policies were not designed on: users of unequal activity (Zipf(1) weights), each with its own number
    of turns (1 + a geometric count, mean ~4.5, at most 14), 20-200-token messages; the next turn is drawn among the users
    with turns left, by weight."""
    rng = random.Random(seed)
    system = tokens(rng, 128)
    left = {u: min(14, 1 + int(rng.expovariate(1 / 4))) for u in range(users)}
    seen: set[int] = set()
    trace = []
    while left:
        live = sorted(left)
        u = rng.choices(live, [1 / (v + 1) for v in live])[0]
        left[u] -= 1
        if not left[u]:
            del left[u]
        trace.append(Turn((system if u not in seen else []) + tokens(rng, rng.randrange(20, 201)), user=u))
        seen.add(u)
    return trace


def support_mix(seed: int, num_requests: int) -> list[Turn]:
    """Another unseen mix: 8 chat users (random order, no turn limit), questions about 4 documents (300-600 tokens,
    Zipf(1)) and 200-500-token one-offs, 45% / 35% / 20% of requests."""
    rng = random.Random(seed)
    system = tokens(rng, 96)
    docs = [tokens(rng, rng.randrange(300, 601)) for _ in range(4)]
    seen: set[int] = set()
    trace = []
    for _ in range(num_requests):
        r = rng.random()
        if r < 0.45:
            u = rng.randrange(8)
            trace.append(Turn((system if u not in seen else []) + tokens(rng, rng.randrange(30, 121)), user=u))
            seen.add(u)
        elif r < 0.8:
            trace.append(Turn(rng.choices(docs, [1, 1 / 2, 1 / 3, 1 / 4])[0] + tokens(rng, 32), tag="doc"))
        else:
            trace.append(Turn(tokens(rng, rng.randrange(200, 501))))
    return trace


def replay(model, trace: list[Turn], policy: str, num_blocks: int) -> dict:
    engine = Engine(model, PagedConfig(block_size=BLOCK_SIZE, num_blocks=num_blocks, max_num_seqs=4,
                                       prefix_eviction_policy=policy))
    params = SamplingParams(max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW)
    history: dict[int, list[int]] = {}
    outputs, prompts, doc_prompt, doc_cached = [], [], 0, 0
    start = time.process_time()
    for turn in trace:
        prompt = history.get(turn.user, []) + turn.tokens if turn.user is not None else turn.tokens
        before = engine.stats()["prompt_tokens_cached"]
        rid = engine.add_request(prompt, params)
        out = engine.run([rid])[rid]
        outputs.append(out.generated_tokens)
        prompts.append(prompt)
        if turn.user is not None:
            history[turn.user] = prompt + list(out.generated_tokens)
        if turn.tag == "doc":
            doc_prompt += len(prompt)
            doc_cached += engine.stats()["prompt_tokens_cached"] - before
    seconds = time.process_time() - start
    engine.check_integrity()
    stats = engine.stats()
    return {
        "hit_rate": stats["prefix_hit_rate"],
        "doc_hit_rate": doc_cached / doc_prompt if doc_prompt else None,
        "computed": stats["prompt_tokens"] - stats["prompt_tokens_cached"],
        "seconds": seconds,
        "tokens": sum(map(len, prompts)) + sum(map(len, outputs)),
        "cached_blocks": stats["blocks_cached"],
        "outputs": outputs,
        "prompts": prompts,
    }


def working_set(model, trace: list[Turn]) -> int:
    """Blocks the prefix cache holds after the trace when nothing is ever evicted."""
    big = 4 * sum(len(t.tokens) + MAX_NEW for t in trace) // BLOCK_SIZE + 64
    return replay(model, trace, "lru", big)["cached_blocks"]


def prompt_lengths(trace: list[Turn]) -> list[int]:
    """Each request's prompt length (a chat turn carries its user's history and the answers)."""
    history: dict[int | None, int] = {}
    out = []
    for t in trace:
        out.append(history.get(t.user, 0) + len(t.tokens) if t.user is not None else len(t.tokens))
        if t.user is not None:
            history[t.user] = out[-1] + MAX_NEW
    return out


def cases_of(model, name: str, seeds: int, quick: bool) -> list[tuple[str, str, int, list[Turn], int]]:
    rounds, users, turns, requests = (4, 6, 4, 24) if quick else (8, 12, 6, 64)
    if name == "docs-bursts":
        return [(name, "140 blocks", seed, docs_bursts(seed, rounds), 140) for seed in range(seeds)]
    make = {"chat": lambda s: chat(s, users, turns), "shared-docs": lambda s: shared_docs(s, requests),
            "chat-zipf": lambda s: chat_zipf(s, 16 if not quick else 6),
            "support-mix": lambda s: support_mix(s, requests + 8)}[name]
    cases = []
    for seed in range(seeds):
        trace = make(seed)
        ws = working_set(model, trace)
        longest = max(prompt_lengths(trace))
        for share in (0.25, 0.50):
            blocks = max(round(share * ws), (longest + MAX_NEW) // BLOCK_SIZE + 4)
            cases.append((name, f"{share:.0%} of {ws} = {blocks}", seed, trace, blocks))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {WORKLOADS}")
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds, users and requests (a smoke run: 4 rounds are too few for a document hit)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, _ = default_model()
    print(f"machine: {machine()}\nmodel: the embedded tiny Llama (hf_paged.default_model()), fp32; block_size "
          f"{BLOCK_SIZE}, {MAX_NEW} new tokens a request, requests one after another in trace order\n")
    cases = [case for name in args.workloads.split(",") for case in cases_of(model, name, args.seeds, args.quick)]
    rows, summary = [], {}
    for name, pool, seed, trace, blocks in cases:
        results = {policy: replay(model, trace, policy, blocks) for policy in POLICIES}
        same = all(results[p]["outputs"] == results["lru"]["outputs"] for p in POLICIES)
        if not same:
            raise SystemExit(f"{name} seed {seed}: greedy outputs differ across policies")
        lru = results["lru"]
        bound = {p: simulate(lru["prompts"], lru["outputs"], blocks, p) for p in MODELLED}
        key = (name, pool.split(" ")[0])
        summary.setdefault(key, {}).setdefault("bound", []).append(bound)
        for policy in POLICIES:
            r = results[policy]
            doc = "-" if r["doc_hit_rate"] is None else f"{r['doc_hit_rate']:.1%}"
            rows.append([name, pool, seed, policy, f"{r['hit_rate']:.1%}", doc, r["computed"],
                         f"{r['tokens'] / r['seconds']:.0f}", f"{r['seconds'] / lru['seconds']:.2f}x", "yes"])
            summary[key].setdefault(policy, []).append(r["hit_rate"])
            summary[key].setdefault(policy + " s", []).append(r["seconds"] / lru["seconds"])
    print_table(["workload", "pool", "seed", "policy", "hit rate", "doc hit rate", "prompt tokens computed",
                 "tokens/s (CPU)", "CPU s vs lru", "same outputs"], rows, title="per run")
    srows = []
    for (name, pool), by in summary.items():
        mean = {p: sum(by[p]) / len(by[p]) for p in POLICIES}
        gains = {p: [100 * (c - b) for c, b in zip(by[p], by["lru"])] for p in POLICIES}
        headroom = [100 * (b["oracle"] - b["lru"]) for b in by["bound"]]
        srows.append([name, pool, *(f"{mean[p]:.1%}" for p in POLICIES),
                      *(f"{sum(gains[p]) / len(gains[p]):+.1f} ({min(gains[p]):+.1f})" for p in POLICIES[1:]),
                      f"{sum(by['slru s']) / len(by['slru s']):.2f}x",
                      f"{sum(headroom) / len(headroom):+.1f} ({min(headroom):+.1f})"])
    print()
    print_table(["workload", "pool", *POLICIES, *(f"{p} - lru, mean (worst)" for p in POLICIES[1:]),
                 "slru CPU s vs lru", "oracle - lru, modelled (worst)"], srows,
                title="mean hit rate over seeds, points over LRU (worst seed)")
    mrows = []
    for (name, pool), by in summary.items():
        gains = {p: [b[p] - b["lru"] for b in by["bound"]] for p in MODELLED}
        mrows.append([name, pool, *(f"{100 * sum(g) / len(g):+.1f} ({100 * min(g):+.1f})" for g in gains.values())])
    print()
    print_table(["workload", "pool", *MODELLED], mrows,
                title="modelled policies on the same prompts (prefix_oracle.py; window+:2 is slru): points over "
                      "modelled LRU, mean (worst seed)")


if __name__ == "__main__":
    main()
