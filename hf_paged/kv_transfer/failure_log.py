"""`FailureLog`: failures of the KV stores and the connector counted by kind, the first of each kind logged.

A save or load that fails costs only a recompute, so it never fails a step; but a disk tier that fails every save
(a removed directory, a full disk, a bound smaller than one file) must say so once: the first failure of each kind
is a warning on the `hf_paged.kv_transfer` logger, later ones of that kind are counted (`counts`, and the
connector's `kv_transfer_*` stats) without a word.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["FailureLog", "logger"]

logger = logging.getLogger("hf_paged.kv_transfer")


class FailureLog:
    """Counts failures by kind ("save", "load", ...) for one object (`where` names it in the message)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()  # saves fail on the writer thread, loads on the reader's

    def record(self, kind: str, detail: object) -> None:
        """Count a failure of `kind`; the first one of the kind is logged with `detail` (the error, or why)."""
        with self._lock:
            n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n == 1:
            logger.warning("%s: a %s failed (%s); the block is recomputed when needed. Later %s failures here are "
                           "counted, not logged", self.where, kind, detail, kind)
