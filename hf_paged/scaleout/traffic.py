"""Which prefixes are hot: an exponentially decayed share of the routed load under each tracked prefix.

A prefix is tracked once it has been some request's affinity key (the deepest block any replica holds). Every
routed request then credits its load to each tracked prefix of its prompt, so a system prompt's share includes the
follow-up turns of the conversations that started under it. Decay without touching every count: each request's
credit grows by 2^(1/half_life) over the previous one; shares are ratios, so the inflation cancels, and counts are
rescaled before they overflow.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

__all__ = ["PrefixTraffic"]

_RESCALE_AT = 1e200


class PrefixTraffic:
    """Decayed load shares of tracked prefixes.

    Args:
        half_life: routed requests after which a request's credit counts half.
        max_keys: tracked prefixes kept; past it the least loaded half is dropped.
    """

    def __init__(self, half_life: float = 2000.0, *, max_keys: int = 65536) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 (routed requests), got {half_life!r}")
        if max_keys < 2:
            raise ValueError(f"max_keys must be >= 2, got {max_keys!r}")
        self._growth = 2.0 ** (1.0 / half_life)
        self._unit = 1.0
        self._total = 0.0
        self._counts: dict[Hashable, float] = {}
        self.max_keys = max_keys

    def __len__(self) -> int:
        return len(self._counts)

    def track(self, key: Hashable) -> None:
        """Start counting the load under `key` (no-op if it is counted already)."""
        self._counts.setdefault(key, 0.0)

    def add(self, digests: Sequence[Hashable], amount: float) -> None:
        """Credit one routed request's load to every tracked prefix among its `digests`."""
        self._unit *= self._growth
        credit = max(0.0, float(amount)) * self._unit
        self._total += credit
        counts = self._counts
        for key in digests:
            if key in counts:
                counts[key] += credit
        if self._unit > _RESCALE_AT:
            self._rescale()
        if len(counts) > self.max_keys:
            self._prune()

    def share(self, key: Hashable) -> float:
        """Fraction of the recent load routed under `key` (0 when untracked or nothing was routed)."""
        return self._counts.get(key, 0.0) / self._total if self._total > 0 else 0.0

    def replicas_wanted(self, key: Hashable, num_replicas: int, hot_threshold: float) -> int:
        """Replicas `key` needs so none takes more than `hot_threshold / num_replicas` of the load for it."""
        want = math.ceil(self.share(key) * num_replicas / hot_threshold - 1e-9)
        return min(num_replicas, max(1, want))

    def _rescale(self) -> None:
        scale = 1.0 / self._unit
        self._unit, self._total = 1.0, self._total * scale
        self._counts = {k: c * scale for k, c in self._counts.items() if c * scale > 1e-300}

    def _prune(self) -> None:
        keep = sorted(self._counts.items(), key=lambda kv: kv[1], reverse=True)[: self.max_keys // 2]
        self._counts = dict(keep)
