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
# Further keys, for explaining where the oracle's gain comes from (`benchmarks/prefix_eviction_gap.py`):
#   oracle_dead   blocks never used again first, then least recent (knows only whether a block has a future)
#   oracle_count  fewest future uses first, then least recent (knows how often, not when)
#   gap           online: furthest estimated next use first, the estimate being the last use plus the mean of
#                 the block's own past gaps (remembered after eviction); once-used blocks first, least recent first
#   slru:F        online: segmented LRU, blocks whose prefix was used twice (ghost-aware) in a protected segment
#                 of at most F x pool blocks, its least recent demoted when full; least recent first per segment
#   window:W      online: least recent first by a clock of pool turnovers, a block whose prefix was used twice
#                 (ghost-aware) counting as touched W turnovers later (ages by construction)
#   window+:W     window:W where a block that extends a reused prefix counts as reused too (a chat's new turn)
#   slru+:F       slru:F with the same extension rule
#   window*:W     window+:W where the extension passes only through a block with at most one cached child: a
#                 prefix many continuations share (a common preamble, a document asked many questions) is a hub,
#                 and a new branch under it earns its own reuse (a new conversation is not a reused one)
EXTRA = ("oracle_dead", "oracle_count", "gap")


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
    name, _, arg = policy.partition(":")
    if policy not in POLICIES + EXTRA and not (name in ("slru", "slru+", "window", "window+", "window*") and arg):
        raise ValueError(f"policy must be one of {POLICIES + EXTRA}, slru:F or window:W, got {policy!r}")
    param = float(arg) if arg else 0.0
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
    used: dict[int, int] = {}  # block -> uses (insert + hits) while cached (+ remembered ones: 2q, slru, window)
    previous: dict[int, int] = {}  # block -> the access before the last (-1: none)
    ghosts: dict[int, int] = {}  # evicted block -> its uses then
    children: dict[int, int] = {}  # cached block -> its cached children
    span: dict[int, tuple[int, int, int]] = {}  # gap: block -> (first use, last use, uses), kept after eviction
    protected: dict[int, None] = {}  # slru: the protected segment
    stamp: dict[int, float] = {}  # window: churn at the last touch (+ param if used twice)
    remembers = policy.startswith(("2q", "slru", "window"))
    inherits = name in ("window+", "window*")  # a block extending a reused prefix counts as reused
    hubs_stop = name == "window*"  # ... unless the prefix branches (window*)
    stored = 0  # blocks newly cached (window's churn clock: stored / num_blocks)
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
        if name.startswith("slru"):
            return (b in protected, cached[b], -depth[b])
        if name.startswith("window"):
            return (stamp[b], cached[b], -depth[b])
        if policy == "gap":
            first, last, n = span[b]
            if n < 2:
                return (0, cached[b], -depth[b])
            expected = last + (last - first) / (n - 1)
            return (1, -max(expected, now + now - last), -depth[b])  # overdue: as far again as it has waited
        at = uses.get(b, [])
        k = bisect.bisect_right(at, now)
        if policy == "oracle_dead":
            return (k < len(at), cached[b], -depth[b])
        if policy == "oracle_count":
            return (len(at) - k, cached[b], -depth[b])
        next_use = at[k] if k < len(at) else float("inf")
        return (-next_use, -depth[b])

    def touch(path: list[int]) -> None:
        """A root path touched (root's child first)."""
        inherit = False
        for b in path:
            reused = used[b] >= 2 or inherit
            inherit = reused and inherits and not (hubs_stop and children.get(b, 0) > 1)
            if name.startswith("window"):
                stamp[b] = stored / num_blocks + (param if reused else 0.0)
        inherit, promote = False, []
        for b in path:
            inherit = (used[b] >= 2 or inherit) and (inherits or name == "slru+")
            if name.startswith("slru") and (used[b] >= 2 or inherit):
                promote.append(b)
        for b in reversed(promote):  # deepest first: slru demotes the end of a prefix before its start
            protected.pop(b, None)
            protected[b] = None  # most recent last

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
        for b in chain[:hit]:
            previous[b], cached[b] = cached[b], i
            used[b] += 1
            first, _, n = span[b]
            span[b] = (first, i, n + 1)
        touch(chain[:hit])
        fresh = -(-(len(prompt) + len(output)) // block) - hit
        while len(cached) + fresh > num_blocks:
            leaves = [b for b in cached if b not in held and children.get(b, 0) == 0]
            if not leaves:
                raise ValueError(f"request {i} needs {fresh} fresh blocks beside {len(held)} held: the pool of "
                                 f"{num_blocks} blocks is too small")
            victim = min(leaves, key=lambda b: key(b, i))
            del cached[victim]
            ghosts[victim] = used.pop(victim)
            protected.pop(victim, None)
            children.pop(victim, None)
            if parent[victim] in children:
                children[parent[victim]] -= 1
        for d, b in enumerate(done_chains[i], start=1):
            if b not in cached:
                stored += 1
                cached[b], depth[b], previous[b] = i, d, -1
                used[b] = 1 + (ghosts.pop(b, 0) if remembers else 0)
                first, last, n = span.get(b, (i, i, 0))
                span[b] = (first, i, n + 1) if last != i or not n else (first, last, n)
                children[b] = 0
                if parent[b] in children:
                    children[parent[b]] += 1
            cached[b] = i
        touch(done_chains[i])
        if name.startswith("slru"):
            while len(protected) > param * num_blocks:  # demote the least recent protected block
                del protected[next(iter(protected))]
    return hits / total if total else 0.0
