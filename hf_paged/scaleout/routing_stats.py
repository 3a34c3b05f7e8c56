"""A replica's routing report, polled often: a full summary now and then, its block events in between.

    poll:      1        2        3   ...   k        k+1
    summary:   S1 -------------------------------->  S2        (rebuilt every `summary_every` polls, or at once when
    events:    -        e(S1..]  e(S1..] ... e(S1..]  -         the events since it no longer fit / were dropped)

Every report is self-contained: the current summary (its `event_seq` says which events it already holds) and every
event after it, as fingerprints. A router that reads only some of the reports (Ray Serve's controller passes the
latest one on) still applies each event exactly once, in order, on top of the summary it holds; a summary it has
not seen resets its view. Events are cheap to hand out (the log is appended to as the engine steps; a poll packs
only the events since the previous poll), a summary is a sort of every cached block: polling often with
`summary_every` > 1 keeps the router's view of a replica's cache about one poll old for the summary's cost.
The load in a report is the summary's (its snapshot); events carry none.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

from hf_paged.scaleout.cache_events import CacheEvents, pack_events
from hf_paged.scaleout.summary import CacheSummary

if TYPE_CHECKING:
    from hf_paged.scaleout.replica import ReplicaReporter

__all__ = ["RoutingStats"]


class RoutingStats:
    """Builds what `EngineReplica.record_routing_stats` returns.

    Args:
        reporter: the replica's `ReplicaReporter` (its engine must have prefix caching on).
        events: record the cache's block events and report them between summaries. Off: every poll is a summary,
            as before.
        summary_every: polls per full summary when events are on.
        max_events: most events reported beside one summary; past it (or when the log dropped some) the next poll
            builds a new summary instead. Default: the engine's pool size.

    Example:
        >>> stats = RoutingStats(ReplicaReporter(engine), summary_every=10)        # doctest: +SKIP
        >>> def record_routing_stats(self): return stats.poll()                    # doctest: +SKIP
    """

    def __init__(self, reporter: ReplicaReporter, *, events: bool = True, summary_every: int = 10,
                 max_events: int | None = None) -> None:
        if isinstance(summary_every, bool) or not isinstance(summary_every, int) or summary_every < 1:
            raise ValueError(f"summary_every must be an int >= 1 (polls per full summary), got {summary_every!r}")
        cache = reporter.engine.kv.prefix_cache
        assert cache is not None  # ReplicaReporter checked it
        self.reporter = reporter
        self.summary_every = summary_every if events else 1
        self.max_events = reporter.engine.cache.num_blocks if max_events is None else max_events
        # The log holds twice what one report may carry: a slow poll still finds its events
        self.log = cache.listen(max(1024, 2 * self.max_events)) if events else None
        self.summary: CacheSummary | None = None
        self._polls = 0
        self._cursor = 0  # the last event packed into _kinds / _keys
        self._kinds = bytearray()
        self._keys = array("Q")
        self.num_summaries = self.num_resyncs = 0

    def poll(self) -> dict[str, Any]:
        """The report for this poll (a plain dict of builtins: Ray pickles it to the router)."""
        due = self.summary is None or self._polls % self.summary_every == 0
        self._polls += 1
        if not due and self.log is not None:
            got = self.log.since(self._cursor)
            if got.resync or len(self._kinds) + len(got.events) > self.max_events:
                self.num_resyncs += 1
                due = True
            else:
                packed = pack_events(got.events, self._cursor + 1)
                self._kinds += packed.kinds
                self._keys.frombytes(packed.fingerprints)
                self._cursor = got.next_seq
        if due:
            self.summary = self.reporter.summary()
            self.num_summaries += 1
            self._cursor, self._kinds, self._keys = self.summary.event_seq, bytearray(), array("Q")
        assert self.summary is not None
        stats = self.summary.to_stats()
        if self.log is not None:
            events = CacheEvents(self.summary.event_seq + 1, bytes(self._kinds), self._keys.tobytes())
            stats["events"] = events.to_stats()
        return stats
