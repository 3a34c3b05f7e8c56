"""Prompt prefixes a request asks the server to keep cached for a while (issue 41: pins with retention).

A request with `cache_retention_seconds: S` (and optionally `cache_retention_tokens: N`, default its whole prompt)
pins the full cached blocks of its prompt's first N tokens once its prompt is computed (its first token out), and
unpins them S seconds later: a system prompt that must not be evicted between two bursts of traffic. Pins are the
engine's (`Engine.pin_prefix`), counted per pin (two requests retaining one prefix hold it until the later expiry),
bounded by `PagedConfig.prefix_pin_share` of the pool: a pin past the bound is refused and counted, the request
itself is answered as usual. S is bounded by the server's `--max-cache-retention` (0 turns the field off).

The engine calls run in a worker thread (they take the engine's lock, which a step holds); the expiries are timers of
the event loop. A weight change empties the prefix cache and its pins: a later expiry then unpins nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence

from hf_paged.batching.engine import Engine
from hf_paged.errors import PrefixPinLimitError

__all__ = ["PrefixRetention"]

logger = logging.getLogger("hf_paged.serving")


class PrefixRetention:
    """The server's timed pins over one engine (module docstring). Event loop thread only."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.num_pinned = 0  # pins taken (each released at its expiry)
        self.num_refused = 0  # pins refused: past prefix_pin_share, or nothing of the prefix cached
        self._timers: dict[int, asyncio.TimerHandle] = {}  # pins not expired yet
        self._keys = itertools.count()

    async def hold(self, token_ids: Sequence[int], seconds: float) -> int:
        """Pin the cached full blocks of `token_ids` for `seconds`; returns the tokens pinned (0: refused)."""
        loop = asyncio.get_running_loop()
        tokens = list(token_ids)
        try:
            pinned = await loop.run_in_executor(None, self.engine.pin_prefix, tokens)
        except PrefixPinLimitError as exc:
            self.num_refused += 1
            logger.warning("cache_retention_seconds: pin refused (%s)", exc)
            return 0
        if not pinned:  # shorter than a block, or evicted already
            self.num_refused += 1
            return 0
        self.num_pinned += 1
        key = next(self._keys)
        self._timers[key] = loop.call_later(seconds, self._expire, key, tokens)
        return pinned

    @property
    def num_held(self) -> int:
        """Pins not expired yet."""
        return len(self._timers)

    def _expire(self, key: int, tokens: list[int]) -> None:
        del self._timers[key]
        asyncio.get_running_loop().run_in_executor(None, self.engine.unpin_prefix, tokens)

    def close(self) -> None:
        """Drop the timers (the server is stopping; the engine's pins go with its cache)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
