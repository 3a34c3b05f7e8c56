"""What a replica tells the router: a bounded, prefix-closed set of block fingerprints, and its load. No torch.

    replica: RadixCache.cached_digests(limit)   ->  CacheSummary.fingerprints  ->  router: set of ints per replica
             (16-byte chained digests, MRU first)    (8 bytes a block, packed)        (plus what it sent since)

A fingerprint is the first 8 bytes of a block's chained digest (`hf_paged.cache.radix.prefix_digests`): the router
digests the prompt the same way and walks its fingerprints while a replica holds them. 64 bits make a false match
about 1 in 10^13 per lookup at 10^6 reported blocks, and a false match costs one routing choice, never a wrong token
(the replica verifies hits on the tokens). The summary is a full snapshot, not a delta: a lost or late report
cannot leave the router out of step for longer than one period. Size: 8 bytes per reported block plus ~100 bytes.
Between summaries a replica may also hand out its block events (`cache_events.py`), numbered after `event_seq`.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_paged.cache.radix import RadixCache, prefix_digests

__all__ = ["CacheSummary", "build_summary", "fingerprint", "prompt_fingerprints"]

_FORMAT = 1  # bump when the stats layout changes; a router refuses formats it does not know


def fingerprint(digest: bytes) -> int:
    """The routing key of one block: the first 8 bytes of its chained digest, as an unsigned int."""
    return int.from_bytes(digest[:8], "little")


def prompt_fingerprints(token_ids: Sequence[int], block_size: int, extra_keys: tuple = ()) -> list[int]:
    """Fingerprints of every full block of a prompt, chained as the replicas' radix trees chain them.

    Pass the replicas' `extra_keys` (e.g. `(cache_salt,)`) or nothing will ever match.
    """
    return [fingerprint(d) for d in prefix_digests(token_ids, block_size, extra_keys)]


def _pack(keys: Sequence[int]) -> bytes:
    packed = array("Q", keys)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unpack(blob: bytes) -> array:
    if len(blob) % 8:
        raise ValueError(f"a fingerprint blob holds 8 bytes per block; got {len(blob)} bytes")
    keys = array("Q")
    keys.frombytes(blob)
    if sys.byteorder != "little":
        keys.byteswap()
    return keys


@dataclass(frozen=True, slots=True)
class CacheSummary:
    """One replica's report: which prefix blocks it caches (capped, most recent first) and how loaded it is."""

    block_size: int  # tokens per block; the router refuses a summary whose block size differs from its own
    fingerprints: bytes  # 8 bytes a block, little-endian, most recently used first, each block after its parent
    num_cached_blocks: int  # blocks the replica's tree holds; more than reported when the cap cut the list
    load_tokens: int  # queued + running tokens still to compute (prompt left + output left) at the snapshot
    seq: int  # grows by one per summary from this replica: the router notices a new report by it
    created_at: float  # time.time() at the snapshot: the router's measure of staleness
    event_seq: int = 0  # the replica's block-event number when the snapshot began: later events apply on top

    @property
    def num_fingerprints(self) -> int:
        return len(self.fingerprints) // 8

    @property
    def is_truncated(self) -> bool:
        return self.num_fingerprints < self.num_cached_blocks

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the fingerprint blob plus the six numbers."""
        return len(self.fingerprints) + 6 * 8

    def keys(self) -> frozenset[int]:
        """The reported fingerprints as a set (what the router looks prompts up in)."""
        return frozenset(_unpack(self.fingerprints))

    def age(self, now: float | None = None) -> float:
        """Seconds since the snapshot (0 if the clocks disagree the other way)."""
        return max(0.0, (time.time() if now is None else now) - self.created_at)

    def to_stats(self) -> dict[str, Any]:
        """A plain dict for Ray Serve's `record_routing_stats()` (builtins only, pickles small)."""
        return {"format": _FORMAT, "block_size": self.block_size, "fingerprints": self.fingerprints,
                "num_cached_blocks": self.num_cached_blocks, "load_tokens": self.load_tokens, "seq": self.seq,
                "created_at": self.created_at, "event_seq": self.event_seq}

    @classmethod
    def from_stats(cls, stats: dict[str, Any]) -> CacheSummary | None:
        """The summary in a routing-stats dict; `None` for an empty dict (a replica that has not reported yet)."""
        if not stats:
            return None
        if stats.get("format") != _FORMAT:
            raise ValueError(
                f"routing stats format {stats.get('format')!r} is not {_FORMAT}: run the same hf_paged version on "
                "the router and the replicas"
            )
        fingerprints = bytes(stats["fingerprints"])
        _unpack(fingerprints)  # validates the length
        return cls(int(stats["block_size"]), fingerprints, int(stats["num_cached_blocks"]),
                   int(stats["load_tokens"]), int(stats["seq"]), float(stats["created_at"]),
                   int(stats.get("event_seq", 0)))


def build_summary(cache: RadixCache, *, limit: int = 8192, load_tokens: int = 0, seq: int = 0,
                  now: float | None = None) -> CacheSummary:
    """Summarize a live radix tree: the fingerprints of its `limit` most recently used blocks.

    Args:
        cache: the replica's prefix cache.
        limit: most blocks to report (8 bytes each): 8192 blocks are 64 KiB a period.
        load_tokens: the replica's queued + running tokens (see `engine_load_tokens`).
        seq: this replica's report counter.
        now: snapshot time (default `time.time()`).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int >= 0 (blocks to report), got {limit!r}")
    # The event number first: events recorded while the snapshot is taken are applied again on top of it, which
    # is harmless (stored/removed set a block's state, and in order the last one wins); missing one would not be.
    event_seq = cache.events.seq if cache.events is not None else 0
    digests = cache.cached_digests(limit)
    return CacheSummary(
        block_size=cache.block_size,
        fingerprints=_pack([fingerprint(d) for d in digests]),
        num_cached_blocks=cache.num_cached_blocks,
        load_tokens=int(load_tokens),
        seq=int(seq),
        created_at=time.time() if now is None else now,
        event_seq=event_seq,
    )
