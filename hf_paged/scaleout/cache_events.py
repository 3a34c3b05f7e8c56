"""Block events on the wire: what a replica's cache stored and removed since its last summary. No torch.

    RadixCache.listen() -> BlockEventLog  -> CacheEvents (after summary.event_seq)  -> router: ReplicaView.apply_events
    (digests, numbered)                      (1 byte + 8-byte fingerprint an event)     (in order, by number)

Events are numbered by the replica's log (`hf_paged.cache.block_events`); a summary carries the number at its
snapshot (`CacheSummary.event_seq`), and the events beside it are those after that number, so a summary and its
events are one self-contained report: a router that missed some reports loses nothing but time. Size: 9 bytes an
event plus ~40 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_paged.cache.block_events import BlockEvent, BlockEventKind
from hf_paged.scaleout.summary import _pack, _unpack, fingerprint

__all__ = ["CacheEvents", "pack_events"]


@dataclass(frozen=True, slots=True)
class CacheEvents:
    """A run of consecutive block events of one replica, as fingerprints."""

    first_seq: int  # the first event's number; the run covers first_seq .. first_seq + num_events - 1
    kinds: bytes  # one `BlockEventKind` value an event
    fingerprints: bytes  # 8 bytes an event, little-endian (0 for CLEARED)

    @property
    def num_events(self) -> int:
        return len(self.kinds)

    @property
    def last_seq(self) -> int:
        """The last event's number (first_seq - 1 when the run is empty)."""
        return self.first_seq + len(self.kinds) - 1

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: 9 an event plus the two numbers."""
        return len(self.kinds) + len(self.fingerprints) + 2 * 8

    def after(self, seq: int) -> tuple[bytes, Sequence[int]]:
        """The kinds and fingerprints of the events numbered after `seq` (all of them when `seq` < first_seq)."""
        skip = min(max(0, seq + 1 - self.first_seq), len(self.kinds))
        return self.kinds[skip:], _unpack(self.fingerprints)[skip:]

    def to_stats(self) -> dict[str, Any]:
        return {"first_seq": self.first_seq, "kinds": self.kinds, "fingerprints": self.fingerprints}

    @classmethod
    def from_stats(cls, stats: dict[str, Any]) -> CacheEvents:
        kinds, keys = bytes(stats["kinds"]), bytes(stats["fingerprints"])
        if len(keys) != 8 * len(kinds):
            raise ValueError(f"{len(kinds)} event kinds but {len(keys)} fingerprint bytes (8 an event expected)")
        if any(k > BlockEventKind.CLEARED for k in kinds):
            raise ValueError(f"unknown block event kind in {sorted(set(kinds))}: run one hf_paged version everywhere")
        return cls(int(stats["first_seq"]), kinds, keys)


def pack_events(events: Sequence[BlockEvent], first_seq: int) -> CacheEvents:
    """Events numbered `first_seq`, `first_seq + 1`, ... (as `BlockEventLog.since` returns them) on the wire."""
    if events and events[0].seq != first_seq:
        raise ValueError(f"the events start at {events[0].seq}, not {first_seq}")
    kinds = bytes(int(e.kind) for e in events)
    return CacheEvents(first_seq, kinds, _pack([0 if e.digest is None else fingerprint(e.digest) for e in events]))
