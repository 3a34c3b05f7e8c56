"""What a prefix cache did, block by block, in order: stored, removed, all cleared. No torch.

    RadixCache.insert  -> STORED(digest)    for each block that became cached
    RadixCache evict / drop subtree -> REMOVED(digest)
    RadixCache.reset   -> CLEARED

                 seq: 1     2     3     4     5     6     7
    log:        [dropped.......][S a][S b][R a][S c]           capacity 4: 1..3 were dropped
    since(2) -> resync (3 is lost: the consumer needs a full summary)
    since(4) -> [R a][S c], next_seq 7

The cache records nothing until a consumer calls `RadixCache.listen()` (one attribute test per stored or removed
block otherwise). The log is bounded: the oldest events are dropped, and a consumer whose cursor falls behind the
oldest held event is told to resynchronise (`EventsSince.resync`) instead of getting a silent gap. A consumer keeps
its own cursor, so any number of them read one log. Appends and reads are single C-level deque operations, safe
between the engine's thread (which records) and a reporter's thread (which reads) under the GIL.

The design follows vLLM's KV events (a stored/removed/cleared stream numbered for gap detection, a full state to
recover from a gap), without a transport of its own: `hf_paged.scaleout.replica` hands the events out.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

__all__ = ["BlockEvent", "BlockEventKind", "BlockEventLog", "EventsSince"]


class BlockEventKind(enum.IntEnum):
    STORED = 0  # the block became cached (an insert created its node)
    REMOVED = 1  # the block stopped being cached (evicted, or dropped with its subtree)
    CLEARED = 2  # every block stopped being cached (reset: new weights)


@dataclass(frozen=True, slots=True)
class BlockEvent:
    seq: int  # 1, 2, 3, ... per log, no holes
    kind: BlockEventKind
    digest: bytes | None  # the block's chained digest; None for CLEARED


@dataclass(frozen=True, slots=True)
class EventsSince:
    """The answer to `BlockEventLog.since(seq)`."""

    events: list[BlockEvent]  # every event after the cursor, in order (empty when resync)
    next_seq: int  # the cursor to ask with next time: the last event's seq (the log's `seq`)
    resync: bool  # events after the cursor were dropped: take a full summary, then read from its `seq`


class BlockEventLog:
    """A bounded, numbered log of block events.

    Args:
        capacity: most events held; older ones are dropped (a consumer behind them must resynchronise).
    """

    def __init__(self, capacity: int = 65536) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1 (events held), got {capacity!r}")
        self.capacity = capacity
        self._events: deque[BlockEvent] = deque(maxlen=capacity)
        self.seq = 0  # the last recorded event's number (0: none yet)

    def record(self, kind: BlockEventKind, digest: bytes | None = None) -> None:
        self.seq += 1
        self._events.append(BlockEvent(self.seq, kind, digest))

    def since(self, seq: int) -> EventsSince:
        """Every event numbered after `seq` (a consumer's cursor: 0, a summary's `event_seq`, or a `next_seq`)."""
        held = list(self._events)  # one C-level copy: the recording thread may append meanwhile
        last = held[-1].seq if held else self.seq
        if seq > last:
            raise ValueError(f"cursor {seq} is ahead of the log's last event {last}: a cursor from another log?")
        oldest = held[0].seq if held else last + 1
        if seq + 1 < oldest:
            return EventsSince([], last, resync=True)
        return EventsSince(held[seq + 1 - oldest:], last, resync=False)
