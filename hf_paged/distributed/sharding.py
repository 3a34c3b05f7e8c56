"""Which rank generates which prompt: prefix affinity, balanced by tokens, the same plan on every rank. No torch.

Prompts that share their first full block form a group, and a group goes to one rank, so its shared prefix is
computed once there and served from that rank's prefix cache afterwards:

    prompts      [sys A|q1] [sys A|q2] [sys A|q3]  [sys B|q4]  [q5]  [q6 ...]
    first block   digest a   digest a   digest a    digest b   none   digest c
    groups       {1, 2, 3}                         {4}        {5}   {6}          (no full block: a group alone)

A group costs what its rank will compute: each distinct full block of its prompts once (the rank's prefix cache
serves the repeats), plus every prompt's partial last block and output budget. A group costing more than a fair
share (all groups' cost / ranks) would leave the others idle (an eval whose prompts all share one few-shot
preamble), so it is split by its next block (deeper while its members still share it) when that lowers the
bound on the busiest rank: each part recomputes the shared preamble once on its rank, far less than one rank
doing everything.

Groups then go largest first onto the lightest rank (LPT; ties: the lower input index first, the lower rank),
integers only: every rank computes the same plan from the same prompts, with no communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hf_paged.cache.radix import prefix_digests

__all__ = ["ShardPlan", "plan_shards"]


@dataclass(slots=True, frozen=True)
class ShardPlan:
    """Where each input is generated."""

    rank_of: tuple[int, ...]  # each input's rank, in input order
    num_tokens: tuple[int, ...]  # each rank's planned tokens (prompt + output budget, shared prefixes once)
    num_groups: int  # prefix groups the prompts formed (after splitting the ones over a fair share)

    @property
    def num_ranks(self) -> int:
        return len(self.num_tokens)

    def indices(self, rank: int) -> list[int]:
        """The inputs `rank` generates, in input order."""
        return [i for i, r in enumerate(self.rank_of) if r == rank]


def plan_shards(prompts: Sequence[Sequence[int]], num_ranks: int, *, block_size: int = 16,
                max_new_tokens: int | Sequence[int] = 0) -> ShardPlan:
    """Assign each prompt to one of `num_ranks` ranks (see the module docstring).

    Args:
        prompts: token-id lists.
        num_ranks: ranks to spread over (>= 1).
        block_size: tokens per block, as in the engines (prefix groups are whole blocks).
        max_new_tokens: the output budget of every prompt, or one per prompt (part of each prompt's cost).

    Example:
        >>> plan_shards([[1] * 8 + [2], [1] * 8 + [3], [5] * 9], 2, block_size=8).rank_of
        (0, 0, 1)
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise ValueError(f"num_ranks must be an int >= 1, got {num_ranks!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prompts):
        raise ValueError(f"got {len(budgets)} max_new_tokens for {len(prompts)} prompts; give one each or one int")
    groups = _prefix_groups(prompts, budgets, num_ranks, block_size)
    loads = [0] * num_ranks
    rank_of = [0] * len(prompts)
    for cost, members in sorted(groups, key=lambda g: (-g[0], g[1][0])):
        rank = min(range(num_ranks), key=lambda r: (loads[r], r))
        loads[rank] += cost
        for i in members:
            rank_of[i] = rank
    return ShardPlan(tuple(rank_of), tuple(loads), len(groups))


@dataclass(slots=True)
class _Group:
    members: list[int]  # input indices, in input order
    depth: int  # the members share block 0..depth (0: the first block); a split buckets them by block depth + 1
    cost: int
    final: bool = False  # splitting it would not lower the makespan bound


def _prefix_groups(prompts: Sequence[Sequence[int]], budgets: list[int], num_ranks: int,
                   block_size: int) -> list[tuple[int, list[int]]]:
    """(cost, members) of each group, in the order of their first member. A group over the fair share of the
    current grouping is split by its next block (deeper while all its members still share it) when that lowers
    the bound on the busiest rank (max(largest group, total / ranks)); otherwise it stays whole."""
    digests = [prefix_digests(p, block_size) for p in prompts]
    unshared = [len(p) % block_size + int(b) for p, b in zip(prompts, budgets)]  # partial last block + output

    def cost(members: list[int]) -> int:  # every distinct full block once, as the rank's prefix cache computes it
        return block_size * len({d for i in members for d in digests[i]}) + sum(unshared[i] for i in members)

    def bucket(members: list[int], depth: int) -> list[list[int]]:
        buckets: dict[object, list[int]] = {}
        for i in members:
            key = digests[i][depth] if depth < len(digests[i]) else ("alone", i)
            buckets.setdefault(key, []).append(i)
        return list(buckets.values())

    groups = [_Group(m, 0, cost(m)) for m in bucket(list(range(len(prompts))), 0)]
    total = sum(g.cost for g in groups)
    while True:
        over = [g for g in groups if not g.final and len(g.members) > 1 and g.cost * num_ranks > total]
        if not over:
            break
        group = max(over, key=lambda g: (g.cost, -g.members[0]))
        depth, parts = group.depth, [group.members]
        while len(parts) == 1:  # members sharing the next block too stay one group: look one block deeper
            depth += 1
            parts = bucket(group.members, depth)
        split = [_Group(m, depth, cost(m)) for m in parts]
        new_total = total - group.cost + sum(g.cost for g in split)
        if max(g.cost for g in split) >= group.cost or new_total >= group.cost * num_ranks:
            group.final = True  # the repeated prefixes would cost more than the spread saves
            continue
        groups.remove(group)
        groups += split
        total = new_total
    return [(g.cost, g.members) for g in sorted(groups, key=lambda g: g.members[0])]
