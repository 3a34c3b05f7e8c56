"""Benchmark and demo workloads, as token lists, deterministic for a seed.

Shared by `hf-paged demo`, `hf-paged bench` and the scripts in `benchmarks/`, so a number in RESULTS.md and a
number printed by the command mean the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Workload:
    """Prompts (token ids) and how many tokens to generate for each."""

    name: str
    prompts: list[list[int]]
    max_new_tokens: list[int]
    messages: list[list[list[int]]] = field(default_factory=list)  # multi-turn: each user's later messages

    def __len__(self) -> int:
        return len(self.prompts)


def _random_tokens(rng: random.Random, n: int, vocab: tuple[int, int]) -> list[int]:
    return [rng.randrange(*vocab) for _ in range(n)]


def ragged(num_prompts: int = 64, min_len: int = 8, max_len: int = 1000, min_new: int = 64, max_new: int = 256,
           vocab: tuple[int, int] = (3, 1000), seed: int = 0) -> Workload:
    """Prompt lengths spread evenly (log-uniform) from `min_len` to `max_len`, random new-token counts."""
    rng = random.Random(seed)
    prompts, news = [], []
    for i in range(num_prompts):
        frac = i / max(num_prompts - 1, 1)
        n = round(min_len * (max_len / min_len) ** frac)
        prompts.append(_random_tokens(rng, n, vocab))
        news.append(rng.randint(min_new, max_new))
    order = list(range(num_prompts))
    rng.shuffle(order)
    return Workload("ragged", [prompts[i] for i in order], [news[i] for i in order])


def shared_prefix(num_questions: int = 64, prefix_len: int = 1000, question_len: tuple[int, int] = (10, 40),
                  max_new: int = 32, vocab: tuple[int, int] = (3, 1000), seed: int = 0) -> Workload:
    """(a) one long system prompt followed by many different questions."""
    rng = random.Random(seed)
    system = _random_tokens(rng, prefix_len, vocab)
    prompts = [system + _random_tokens(rng, rng.randint(*question_len), vocab) for _ in range(num_questions)]
    return Workload("shared-prefix", prompts, [max_new] * num_questions)


def few_shot(num_queries: int = 32, shots: int = 8, shot_len: int = 60, query_len: int = 30, max_new: int = 16,
             vocab: tuple[int, int] = (3, 1000), seed: int = 0) -> Workload:
    """(b) k-shot prompts: the same examples (in the same order) before each query."""
    rng = random.Random(seed)
    examples = [t for _ in range(shots) for t in _random_tokens(rng, shot_len, vocab)]
    prompts = [examples + _random_tokens(rng, query_len, vocab) for _ in range(num_queries)]
    return Workload("few-shot", prompts, [max_new] * num_queries)


def multi_turn(num_users: int = 8, num_turns: int = 4, first_len: int = 200, message_len: int = 40,
               max_new: int = 32, vocab: tuple[int, int] = (3, 1000), seed: int = 0) -> Workload:
    """(c) chats: turn t's prompt is turn t-1's prompt + its answer + a new message. The answers are not known
    in advance, so this returns turn 0 only, plus the messages; use `next_turn` with each answer."""
    rng = random.Random(seed)
    prompts = [_random_tokens(rng, first_len, vocab) for _ in range(num_users)]
    messages = [[_random_tokens(rng, message_len, vocab) for _ in range(num_turns - 1)] for _ in range(num_users)]
    return Workload("multi-turn", prompts, [max_new] * num_users, messages)


def next_turn(previous_prompt: list[int], answer: list[int], message: list[int]) -> list[int]:
    return previous_prompt + answer + message


def left_pad(prompts: list[list[int]], pad: int = 0):
    """`(input_ids, attention_mask)` of a left-padded batch, as users hand them to stock `generate`."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask
