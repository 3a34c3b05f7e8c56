"""The unseeded draws of one `generate` call, taken as stock takes them: for every row until the call ends.

Stock `generate` samples its whole batch at every step: one `torch.multinomial` over [rows, vocab], which on the
CPU takes rows x vocab draws of Exp(1) from torch's global generator, in row order (ATen's exponential race; the
same stream as one draw per row, in order). A row that ended (EOS, a stop string, a criterion) stays in stock's
batch: it is still drawn for, and its token is replaced by padding. The engine samples only its live rows. So after
a row's end every later row of the call drew from a shifted stream, and a warm repeat of a sampled call matched
stock only until its first row ended.

`generate` registers its rows (`StockBatch.register`, stock's row order: each prompt, then its forks). At a step
where some of them draw, each row that ended is a *ghost*: `vocab` draws are taken at its place in the order and
thrown away (`ghost_counts`, `draw_ghosts`). Rows that draw from their own seed, or that are not in this step (out
of stock's lockstep: a prompt still in prefill, a preempted row), take nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["StockBatch", "draw_ghosts", "ghost_counts"]

NO_GHOSTS = (0, 0)


class StockBatch:
    """The rows of one `generate` call, in stock's row order, and the engine's requests for those seen so far."""

    __slots__ = ("order", "seen", "_registry")

    def __init__(self, order: Sequence[str], registry: dict[str, StockBatch]) -> None:
        self.order = list(order)
        self.seen: dict[str, object] = {}  # request id -> its Request, once it drew
        self._registry = registry

    @classmethod
    def register(cls, registry: dict[str, StockBatch], order: Sequence[str]) -> StockBatch:
        """Make the requests `order` (not yet added) one stock batch of the sampler whose `registry` this is."""
        batch = cls(order, registry)
        registry.update(dict.fromkeys(batch.order, batch))
        return batch

    def unregister(self) -> None:
        for rid in self.order:
            if self._registry.get(rid) is self:
                del self._registry[rid]


def ghost_counts(registry: dict[str, StockBatch], requests: Sequence, rows: Sequence[int],
                 ) -> dict[int, tuple[int, int]]:
    """For the rows about to draw from the global generator (`rows`, in draw order): row -> (ghosts to draw just
    before it, ghosts just after it), for rows of registered stock batches; other rows are absent."""
    groups: dict[int, tuple[StockBatch, dict[str, int]]] = {}
    for i in rows:
        request = requests[i]
        batch = registry.get(request.request_id)
        if batch is not None:
            batch.seen[request.request_id] = request
            groups.setdefault(id(batch), (batch, {}))[1][request.request_id] = i
    counts: dict[int, tuple[int, int]] = {}
    for batch, drawing in groups.values():
        before, last = 0, None
        for rid in batch.order:
            i = drawing.get(rid)
            if i is not None:
                counts[i], before, last = (before, 0), 0, i
            elif (member := batch.seen.get(rid)) is not None and member.status.ended:
                before += 1
        if before and last is not None:
            counts[last] = (counts[last][0], before)
    return counts


def draw_ghosts(count: int, like: torch.Tensor) -> None:
    """Take `count` rows' draws (a row of `like`'s width each) from the global generator of `like`'s device."""
    if count:
        torch.empty(count, like.shape[-1], dtype=torch.float32, device=like.device).exponential_()
