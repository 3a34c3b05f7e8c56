"""An offline oracle for prefix-cache eviction: Belady's MIN on a recorded trace (issue 41, point 3).

The prefix-eviction benchmark asks whether a policy gains >= 5 points of hit rate over LRU where the pool is
tight. That is only a fair target where some policy could: this replays the same prompts, one request after
another, through a block-level model of the engine's prefix cache and reports the hit rate of

  lru     least recently used first (the engine's LRU key: last access, then deepest), as a calibration of the
          model against the engine's measured LRU;
  lfu     fewest hits first (then least recent);
  lru2    oldest second-to-last use first (LRU-2; blocks used once go first, least recent of them first);
  2q      blocks whose prefix was used at least twice, counting uses remembered after eviction (a ghost list),
          are kept over blocks used once; least recent first within each class (2Q / SLRU with a ghost list);
  oracle  furthest next use first (Belady's MIN, which knows every future prompt; ties: deepest first). Blocks are
          all one size and a request reads whole root paths, so evicting the block needed furthest in the future
          is the classic optimum of unit-size caching; the tree only adds that a parent is never needed later than
          its children, so MIN evicts leaves first as the radix tree must.

The model: a request's prompt is cut into 16-token blocks chained by their prefix (the radix tree's digests); its
hit is the longest run of leading blocks cached (a prompt that is all cached still computes its last block, as
the engine does). While it runs it holds its hit blocks and one fresh block per further block of its prompt and
new tokens, so the cache keeps at most `num_blocks` minus the fresh ones; evictions happen then. When it ends its
full blocks (prompt and computed new tokens) join the cache. Not modelled: partial-block tails (the engine's
measured hit rates include a few such tokens, which is why the lru row here reads a little under the engine's).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

BLOCK = 16
POLICIES = ("lru", "lfu", "lru2", "2q", "oracle")


def _chains(seqs: Sequence[Sequence[int]], block: int, ids: dict) -> list[list[int]]:
    """Each sequence's full blocks as ids, equal where the whole prefix up to and including the block is equal
    (`ids` maps (parent id, block tokens) to ids; shared between calls that must agree)."""
    out = []
    for seq in seqs:
        parent, chain = -1, []
        for start in range(0, len(seq) - block + 1, block):
            parent = ids.setdefault((parent, tuple(seq[start:start + block])), len(ids))
            chain.append(parent)
        out.append(chain)
    return out


def simulate(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], num_blocks: int, policy: str,
             block: int = BLOCK) -> float:
    """Prompt tokens served from the cache / prompt tokens, for `policy` in `POLICIES`."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    prompt_chains = _chains(prompts, block, ids)
    # the computed tokens of a finished request: its prompt and every new token but the last (never fed back)
    done_chains = _chains([list(p) + list(o)[:-1] for p, o in zip(prompts, outputs)], block, ids)
    uses: dict[int, list[int]] = {}
    for i, chain in enumerate(prompt_chains):
        for b in chain:
            uses.setdefault(b, []).append(i)
    parent: dict[int, int] = {}
    for chain in done_chains:
        for up, b in zip([-1, *chain], chain):
            parent[b] = up
    cached: dict[int, int] = {}  # block -> last access (request index)
    depth: dict[int, int] = {}
    used: dict[int, int] = {}  # block -> uses (insert + hits) while cached
    previous: dict[int, int] = {}  # block -> the access before the last (-1: none)
    ghosts: dict[int, int] = {}  # evicted block -> its uses then
    children: dict[int, int] = {}  # cached block -> its cached children
    hits = total = 0

    def key(b: int, now: int) -> tuple[float, ...]:
        if policy == "lru":
            return (cached[b], -depth[b])
        if policy == "lfu":
            return (used[b], cached[b], -depth[b])
        if policy == "lru2":
            return (previous[b], cached[b], -depth[b])
        if policy == "2q":
            return (min(used[b], 2), cached[b], -depth[b])
        at = uses.get(b, [])
        k = bisect.bisect_right(at, now)
        next_use = at[k] if k < len(at) else float("inf")
        return (-next_use, -depth[b])

    for i, (prompt, output) in enumerate(zip(prompts, outputs)):
        chain = prompt_chains[i]
        hit = 0
        while hit < len(chain) and chain[hit] in cached:
            hit += 1
        if hit * block >= len(prompt):  # all cached: the last block is computed again
            hit -= 1
        hits += hit * block
        total += len(prompt)
        held = set(chain[:hit])
        for b in held:
            previous[b], cached[b] = cached[b], i
            used[b] += 1
        fresh = -(-(len(prompt) + len(output)) // block) - hit
        while len(cached) + fresh > num_blocks:
            leaves = [b for b in cached if b not in held and children.get(b, 0) == 0]
            if not leaves:
                raise ValueError(f"request {i} needs {fresh} fresh blocks beside {len(held)} held: the pool of "
                                 f"{num_blocks} blocks is too small")
            victim = min(leaves, key=lambda b: key(b, i))
            del cached[victim]
            ghosts[victim] = used.pop(victim)
            children.pop(victim, None)
            if parent[victim] in children:
                children[parent[victim]] -= 1
        for d, b in enumerate(done_chains[i], start=1):
            if b not in cached:
                cached[b], depth[b], previous[b] = i, d, -1
                used[b] = 1 + (ghosts.pop(b, 0) if policy == "2q" else 0)
                children[b] = 0
                if parent[b] in children:
                    children[parent[b]] += 1
            cached[b] = i
    return hits / total if total else 0.0
