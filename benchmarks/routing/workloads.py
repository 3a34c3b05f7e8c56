"""Workloads of the routing simulator: synthetic sessions (short, long, mixed prompts; with or without a preamble
every prompt shares) and traces in the Mooncake format (a JSONL line a request: `timestamp` in ms,
`input_length`, `output_length`, `hash_ids` of fixed-size blocks).

Tokens are only counted, never made: a block's key is a chained hash of (parent key, the segments it covers), as
`prefix_digests` chains real blocks. A trace's `hash_ids` are chained the same way, so two prompts share a block
key only when they share every block before it.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["KINDS", "Session", "Stream", "Workload", "read_trace", "synthetic", "write_synthetic_trace"]

KINDS = ("short", "long", "mix")
NUM_SYSTEM_PROMPTS = 1000
ZIPF_S = 1.0
THINK_S = 3.0
PREAMBLE_TOKENS = 128  # a chat template's fixed text at the start of every prompt (with --preamble)


@dataclass(slots=True)
class Stream:
    """A token stream as chained block keys: full blocks so far, plus the segments of the partial last block."""

    block_size: int
    keys: list[int] = field(default_factory=list)
    tail: tuple = ()
    tail_len: int = 0

    def extend(self, segment: int, length: int) -> Stream:
        keys, tail, tail_len, offset, bs = list(self.keys), self.tail, self.tail_len, 0, self.block_size
        while offset < length:
            take = min(bs - tail_len, length - offset)
            tail, tail_len, offset = tail + ((segment, offset, take),), tail_len + take, offset + take
            if tail_len == bs:
                keys.append(hash((keys[-1] if keys else 0, tail)))
                tail, tail_len = (), 0
        return Stream(bs, keys, tail, tail_len)

    @property
    def num_tokens(self) -> int:
        return len(self.keys) * self.block_size + self.tail_len


@dataclass(slots=True)
class Session:
    """Turns sent one after another: turn i+1 arrives `think` seconds after turn i ended (closed loop). A trace
    request is a session of one fixed turn."""

    start: float
    base: Stream | None = None  # synthetic: preamble + system prompt + document, before the first user message
    turns: list[tuple[int, int]] = field(default_factory=list)  # synthetic: (user tokens, output tokens)
    think: list[float] = field(default_factory=list)
    fixed: list[tuple[list[int], int, int]] = field(default_factory=list)  # trace: (block keys, input, output)

    @property
    def num_turns(self) -> int:
        return len(self.fixed) or len(self.turns)


@dataclass(slots=True)
class Workload:
    name: str
    block_size: int
    sessions: list[Session]
    tokens: int  # prompt + output tokens of every request: what --load is relative to


def _zipf_picker(n: int, rng: random.Random):
    cumulative = list(itertools.accumulate(1.0 / (k + 1) ** ZIPF_S for k in range(n)))
    return lambda: bisect.bisect_left(cumulative, rng.random() * cumulative[-1])


def synthetic(kind: str, *, num_requests: int, preamble: bool, block_size: int, seed: int) -> Workload:
    """Sessions until `num_requests` requests (start times unset: see `spread`).

    short: 55% chats of 2-12 turns resending the whole history, 35% one-off questions, under a system prompt of
        200-1,000 tokens drawn from 1,000 by Zipf(1.0); 10% prompts of 200-2,000 tokens that share nothing.
    long: a document of 8k-30k tokens (drawn by Zipf(1.0) from one per two sessions: popular ones recur) under a
        system prompt, then 1-6 questions about it, each resending the history.
    mix: each session long or short with equal odds.
    """
    if kind not in KINDS:
        raise ValueError(f"workload kind must be one of {KINDS}, got {kind!r}")
    rng = random.Random(seed)
    system_lengths = [rng.randint(200, 1000) for _ in range(NUM_SYSTEM_PROMPTS)]
    pick_system = _zipf_picker(NUM_SYSTEM_PROMPTS, rng)
    num_docs = max(10, num_requests // 6)
    doc_lengths = [rng.randint(8000, 30000) for _ in range(num_docs)]
    pick_doc = _zipf_picker(num_docs, rng)
    root = Stream(block_size).extend(-1, PREAMBLE_TOKENS) if preamble else Stream(block_size)
    sessions, count, tokens = [], 0, 0
    while count < num_requests:
        long = kind == "long" or (kind == "mix" and rng.random() < 0.5)
        roll = rng.random()
        if long:
            system, doc = pick_system(), pick_doc()
            base = root.extend(-10 - system, system_lengths[system]).extend(-10_000 - doc, doc_lengths[doc])
            turns = [(rng.randint(30, 300), rng.randint(50, 400)) for _ in range(rng.randint(1, 6))]
        elif roll < 0.10:
            base, turns = root, [(rng.randint(200, 2000), rng.randint(50, 400))]
        else:
            system = pick_system()
            base = root.extend(-10 - system, system_lengths[system])
            num_turns = 1 if roll < 0.45 else min(12, 2 + int(rng.expovariate(1 / 3)))
            turns = [(rng.randint(30, 300), rng.randint(50, 400)) for _ in range(num_turns)]
        history = base.num_tokens
        for user, out in turns:
            history += user
            tokens += history + out
            history += out
        sessions.append(Session(0.0, base, turns, [rng.expovariate(1 / THINK_S) for _ in turns]))
        count += len(turns)
    name = f"{kind}{' + preamble' if preamble else ''}"
    return Workload(name, block_size, sessions, tokens)


def spread(workload: Workload, window: float, rng: random.Random) -> None:
    """Start the sessions as a Poisson stream over `window` seconds (synthetic workloads)."""
    for session, start in zip(workload.sessions, sorted(rng.uniform(0, window) for _ in workload.sessions)):
        session.start = start


def chain(hash_ids: list[int]) -> list[int]:
    """A trace's block ids chained: a key names the block and every block before it."""
    keys, parent = [], 0
    for block in hash_ids:
        parent = hash((parent, block))
        keys.append(parent)
    return keys


def read_trace(path: Path, *, block_size: int, limit: int | None = None) -> Workload:
    """A Mooncake-format trace, one request per line, as one-turn sessions at their timestamps (seconds)."""
    sessions, tokens = [], 0
    with open(path) as f:
        for line in itertools.islice(f, limit):
            if not line.strip():
                continue
            row = json.loads(line)
            prompt, out = int(row["input_length"]), max(1, int(row["output_length"]))
            keys = chain(row["hash_ids"][: prompt // block_size])  # full blocks only: a partial one is never cached
            sessions.append(Session(float(row["timestamp"]) / 1000.0, fixed=[(keys, prompt, out)]))
            tokens += prompt + out
    sessions.sort(key=lambda s: s.start)
    return Workload(f"trace {Path(path).name}", block_size, sessions, tokens)


def synthetic_trace_rows(num_requests: int, *, seed: int, block_size: int = 512, rate: float = 4.0
                         ) -> Iterator[dict]:
    """Mooncake-format rows of a multi-turn chat service: every prompt starts with one shared block (a preamble);
    conversations resend their history, 8k-30k-token prompts; Poisson arrivals at `rate` requests/s."""
    rng = random.Random(seed)
    next_id = itertools.count(1)
    live: list[list[int]] = []  # open conversations: their block ids so far
    lengths: list[int] = []
    now = 0.0
    for _ in range(num_requests):
        now += rng.expovariate(rate)
        if live and rng.random() < 0.6:  # a follow-up turn of an open conversation
            i = rng.randrange(len(live))
            added = rng.randint(200, 3000)
            lengths[i] += added
            live[i] = live[i] + [next(next_id) for _ in range(-(-lengths[i] // block_size) - len(live[i]))]
            ids, length = live[i], lengths[i]
            if rng.random() < 0.3:
                live.pop(i), lengths.pop(i)
        else:
            length = rng.randint(8000, 30000)
            ids = [0] + [next(next_id) for _ in range(-(-length // block_size) - 1)]
            live.append(ids), lengths.append(length)
        yield {"timestamp": int(now * 1000), "input_length": length, "output_length": rng.randint(20, 600),
               "hash_ids": list(ids)}


def write_synthetic_trace(path: Path, num_requests: int, *, seed: int = 0, block_size: int = 512) -> Path:
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in synthetic_trace_rows(num_requests, seed=seed, block_size=block_size))
    return Path(path)
