"""The router's values: its settings (`RouterConfig`, every bound relative), a request as the router sees it, the
decision it returns with its reason, and a booking (a choice counted before the replica accepted it). Pure data;
`policy.py` decides."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["Booking", "RouteReason", "RouteRequest", "RouterConfig", "RoutingDecision"]


@dataclass(slots=True)
class RouterConfig:
    """Knobs of `CacheAwareRouter`, all relative; the defaults are the ones `benchmarks/routing_sim.py` measured on
    short, long and mixed prompts, with and without a shared preamble, at 8 to 100 replicas."""

    block_size: int = 16  # tokens per block, as on the replicas (matches are counted in tokens)
    balance_factor: float = 1.2  # affinity holds while a replica's recent work <= this x the mean (+ a mean request)
    queue_factor: float = 4.0  # ... and its load <= the mean load + this x the prefill its match saves (+ one)
    min_gain_share: float = 0.2  # a match saving less than this share of the prompt is no affinity
    shared_share: float = 0.9  # blocks held by this share of the candidates are shared (a preamble): no affinity
    balance_half_life: float = 50.0  # routed requests per replica after which work counts half
    hot_threshold: float = 1.0  # a prefix past this many replicas' fair share of work gets share*N/this replicas
    traffic_half_life: float = 2000.0  # routed requests after which a request weighs half in the prefix shares

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"RouterConfig.block_size must be an int >= 1, got {self.block_size!r}")
        if not self.balance_factor >= 1.0:
            raise ValueError(f"RouterConfig.balance_factor must be >= 1 (x the mean work), got {self.balance_factor!r}")
        if not self.queue_factor >= 0:
            raise ValueError(f"RouterConfig.queue_factor must be >= 0 (x the prefill saved), got {self.queue_factor!r}")
        for name in ("min_gain_share", "shared_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"RouterConfig.{name} must be in [0, 1] (a share), got {getattr(self, name)!r}")
        for name in ("balance_half_life", "hot_threshold", "traffic_half_life"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RouterConfig.{name} must be > 0, got {getattr(self, name)!r}")


class RouteReason(enum.Enum):
    NO_MATCH = "no_match"  # no replica holds the first block: by load (the lightest of a few random replicas)
    LOW_GAIN = "low_gain"  # matches save too little beyond what (nearly) every replica holds: by load
    AFFINITY = "affinity"  # the fitting replica whose match saves the most prefill
    HOT_SPREAD = "hot_spread"  # a hot prefix: the same, among the replicas holding it
    HOT_ADMIT = "hot_admit"  # a hot prefix with too few replicas: one more admitted (the lightest of a few others)
    IMBALANCED = "imbalanced"  # every affine replica is past a load bound: by load


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the router needs to know about a request."""

    request_id: Hashable  # unique while in flight (the adapter's id)
    digests: Sequence[Hashable]  # fingerprints of the prompt's full blocks, chained (`prompt_fingerprints`)
    num_prompt_tokens: int  # prompt length
    num_output_tokens: int = 0  # output budget (max new tokens): the decode part of the load it adds
    num_shared_tokens: int = 0  # the prompt's start every prompt has (a chat template's constant start): no affinity


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """A ranked choice: try `replica_ids[0]`, fall back in order."""

    replica_ids: list[Hashable]  # best first, no duplicates, all known candidates
    reason: RouteReason
    num_cached_blocks: int  # blocks the first choice is believed to hold (reported | sent since)
    prefix_key: Hashable | None  # the affinity key (deepest block any replica holds); None unless some match gains
    num_replicas_wanted: int  # replicas the key's load calls for (1 unless hot)


@dataclass(slots=True, eq=False)
class Booking:
    """A request counted on a replica: provisional from the choice (`book`), confirmed when it was accepted."""

    replica_id: Hashable
    digests: Sequence[Hashable]
    added: int  # load tokens it added (uncached prompt + output budget)
    credit: float  # work it added, in the router's inflated units (undone with the booking)
    unit: float  # the request count it added, same units
    confirmed: bool = False
