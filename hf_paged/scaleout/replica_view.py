"""What the router believes of one replica: its last reported cache and load, plus what it was sent since.

    holds(key)  = key in the last report | sent since | sent in the period before (may predate the report)
                  | chosen for a request not yet accepted (`pending`: counted, so a choice can be undone exactly)
    load        = max(0, reported load + uncached work sent since the report - work finished since)
    work        = decayed work routed here (the router's inflated units: see `CacheAwareRouter`)

A reported summary is closed under prefixes (a radix tree's) and so is what the router sent, so a replica's match
of a prompt's chained digests is found by binary search. Block events between summaries (`apply_events`) keep
`keys` current; a radix tree stores a block after its parent and removes it before, so in order they keep it
closed under prefixes too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from hf_paged.cache.block_events import BlockEventKind

__all__ = ["ReplicaView"]


@dataclass(slots=True, eq=False)
class ReplicaView:
    replica_id: Hashable
    keys: frozenset | set = frozenset()  # fingerprints of the last report (a set once events changed it)
    sent: set = field(default_factory=set)  # fingerprints routed here since the last report
    sent_before: set = field(default_factory=set)  # ... in the period before: may still be queued at the report
    pending: Counter = field(default_factory=Counter)  # fingerprints of choices not yet accepted -> their number
    reported_load: int = 0
    sent_since_report: int = 0
    finished_since_report: int = 0
    load: int = 0  # max(0, reported_load + sent_since_report - finished_since_report)
    work: float = 0.0  # decayed work routed here, in the router's inflated units
    num_reports: int = 0
    num_events: int = 0  # block events applied since the start

    def holds(self, key: Hashable) -> bool:
        return key in self.keys or key in self.sent or key in self.sent_before or key in self.pending

    def match(self, digests: Sequence[Hashable]) -> int:
        """Leading digests held. Holdings are closed under prefixes, so this is a binary search."""
        if not digests or not self.holds(digests[0]):
            return 0
        keys, sent, before, pending = self.keys, self.sent, self.sent_before, self.pending
        low, high = 1, len(digests)  # digests[:low] held; digests[high:] may or may not be
        while low < high:
            mid = (low + high + 1) // 2
            key = digests[mid - 1]
            if key in keys or key in sent or key in before or key in pending:
                low = mid
            else:
                high = mid - 1
        return low

    def add_pending(self, digests: Sequence[Hashable]) -> None:
        """A request with these digests was chosen for this replica and is not accepted yet."""
        self.pending.update(digests)

    def drop_pending(self, digests: Sequence[Hashable]) -> None:
        """Undo one `add_pending` of the same digests (the request was accepted, moved or dropped)."""
        pending = self.pending
        for key in digests:
            left = pending[key] - 1
            if left > 0:
                pending[key] = left
            else:
                pending.pop(key, None)

    def take_report(self, keys: frozenset, load_tokens: int) -> None:
        if isinstance(load_tokens, bool) or not isinstance(load_tokens, int | float) \
                or not 0 <= load_tokens < float("inf"):  # (int() of NaN / inf / None raised naming nothing: h8 F8)
            raise ValueError(f"a replica's report needs load_tokens, its queued + running tokens, as a finite number "
                             f">= 0; got {load_tokens!r}")
        self.keys = keys
        self.sent_before, self.sent = self.sent, set()  # what was sent two periods ago is in the report
        self.reported_load, self.sent_since_report, self.finished_since_report = int(load_tokens), 0, 0
        self.num_reports += 1
        self.refresh_load()

    def apply_events(self, kinds: Sequence[int], keys: Sequence[Hashable]) -> None:
        """Apply block events in order: `kinds[i]` (a `BlockEventKind`) happened to the block `keys[i]`.

        STORED adds the block to what the replica holds, REMOVED drops it (from the report and from what was sent:
        the replica computed and evicted it), CLEARED drops everything (the weights changed)."""
        if not kinds:
            return
        if len(kinds) != len(keys) or any(kind not in _KINDS for kind in kinds):  # (zip cut them, unknown codes cleared)
            raise ValueError(f"block events need one key per kind and kinds among {sorted(_KINDS)}; got "
                             f"{len(kinds)} kinds {list(kinds)[:8]} for {len(keys)} keys")
        held = self.keys if isinstance(self.keys, set) else set(self.keys)  # the report is shared: copy once
        for kind, key in zip(kinds, keys):
            if kind == BlockEventKind.STORED:
                held.add(key)
            elif kind == BlockEventKind.REMOVED:
                held.discard(key)
                self.sent.discard(key)
                self.sent_before.discard(key)
            else:
                held.clear()
                self.sent.clear()
                self.sent_before.clear()
        self.keys = held
        self.num_events += len(kinds)

    def refresh_load(self) -> None:
        self.load = max(0, self.reported_load + self.sent_since_report - self.finished_since_report)


_KINDS = frozenset(int(kind) for kind in BlockEventKind)
