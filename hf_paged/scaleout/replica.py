"""The replica side of routing: an engine's load and cache summary, one snapshot per reporting period."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from hf_paged.scaleout.summary import CacheSummary, build_summary

if TYPE_CHECKING:
    from hf_paged.batching.engine import Engine

__all__ = ["ReplicaReporter", "engine_load_tokens"]


def engine_load_tokens(engine: Engine) -> int:
    """Queued + running tokens still to compute: each live request's prompt left plus its output budget left.

        prompt_ids             | output_ids    | (max_new_tokens - generated) |
        |-- computed --|-- left --|             |---------- left -------------|

    The output part counts the whole remaining budget (EOS is not known ahead), as the router counts it.
    """
    load = 0
    for request in engine.live_requests():  # a copy: safe while the loop thread steps
        prompt_left = max(0, len(request.prompt_ids) - request.num_computed_tokens)
        load += prompt_left + max(0, request.params.max_new_tokens - len(request.output_ids))
    return load


class ReplicaReporter:
    """Builds an engine's `CacheSummary` on demand, numbering them (Ray Serve polls `record_routing_stats`).

    Args:
        engine: the replica's engine; it must have prefix caching on.
        limit: most blocks per summary (8 bytes each); default: the whole pool, so a summary is never cut. A cut
            summary makes the router forget blocks it sent there that the replica still holds (the simulator
            measured it worse than no summary at all): keep it at or above the pool's size.

    Example:
        >>> reporter = ReplicaReporter(engine)                                      # doctest: +SKIP
        >>> def record_routing_stats(self): return reporter.summary().to_stats()   # doctest: +SKIP
    """

    def __init__(self, engine: Engine, *, limit: int | None = None) -> None:
        if engine.kv.prefix_cache is None:
            raise ValueError(
                "the engine has no prefix cache, so a replica has nothing to report for routing: build it with "
                "PagedConfig(enable_prefix_caching=True)"
            )
        self.engine = engine
        self.limit = engine.cache.num_blocks if limit is None else limit
        self._seq = itertools.count(1)

    @property
    def extra_keys(self) -> tuple:
        """What the replica's digests include besides tokens: the router must digest prompts with the same."""
        return self.engine.config.block_extra_keys

    def summary(self) -> CacheSummary:
        cache = self.engine.kv.prefix_cache
        assert cache is not None  # checked in __init__
        return build_summary(cache, limit=self.limit, load_tokens=engine_load_tokens(self.engine),
                             seq=next(self._seq))
