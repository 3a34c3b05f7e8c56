"""`ByteLRU`: a least-recently-used map bounded by its entries' measured bytes as well as by their count.

The mechanism under the caches of constrained decoding (`IndexCache`'s compiled indexes, the server's processors):
what an entry weighs is the caller's measurement (`sizes.held_bytes`, a mask counter), given when the entry is
stored and again whenever it grows; the map drops least recently used entries until both bounds hold, never the
entry just stored, read or resized (the one in use). Not thread-safe: its owner calls it under its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["ByteLRU"]

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """Args:
        max_entries: most entries (None: no count bound).
        max_bytes: most bytes of entries, by their recorded sizes (None: no byte bound).
        on_drop: called with (key, value) for each entry the bounds drop (not for `pop` or `clear`).
    """

    def __init__(self, max_entries: int | None, max_bytes: int | None,
                 on_drop: Callable[[Any, V], None] | None = None) -> None:
        for name, value in (("max_entries", max_entries), ("max_bytes", max_bytes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.on_drop = on_drop
        self._items: OrderedDict[Any, V] = OrderedDict()
        self._sizes: dict[Any, int] = {}
        self.num_bytes = 0  # sum of the recorded sizes
        self.num_dropped = 0  # entries the bounds dropped, ever

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Any) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __setitem__(self, key: Any, value: V) -> None:
        """`put(key, value, 0)`: an entry weighed later (`resize`)."""
        self.put(key, value, 0)

    def peek(self, key: Any) -> V | None:
        """The value of `key`, or None; its recency unchanged."""
        return self._items.get(key)

    def get(self, key: Any) -> V | None:
        """The value of `key` (now the most recently used), or None."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def size_of(self, key: Any) -> int:
        return self._sizes.get(key, 0)

    def put(self, key: Any, value: V, num_bytes: int) -> None:
        """Store `value` under `key` (replacing any), weighing `num_bytes`; then enforce the bounds."""
        if key in self._items:
            self.pop(key)
        self._items[key] = value
        self.resize(key, num_bytes)

    def resize(self, key: Any, num_bytes: int, *, touch: bool = True, enforce: bool = True) -> None:
        """Record that `key`'s entry now weighs `num_bytes` (and, with `touch`, that it is the most recently used);
        with `enforce`, drop least recently used entries until the bounds hold, never `key`'s. Unknown keys are
        ignored."""
        if key not in self._items:
            return
        if touch:
            self._items.move_to_end(key)
        self.num_bytes += num_bytes - self._sizes.get(key, 0)
        self._sizes[key] = num_bytes
        while enforce and len(self._items) > 1 and self._over():
            oldest = next(iter(self._items))
            if oldest == key:  # (not touched: the next oldest)
                oldest = next(k for k in self._items if k != key)
            value = self.pop(oldest)
            self.num_dropped += 1
            if self.on_drop is not None:
                self.on_drop(oldest, value)

    def pop(self, key: Any, default: V | None = None) -> V | None:
        """Remove `key`'s entry and return its value (`default` when absent)."""
        self.num_bytes -= self._sizes.pop(key, 0)
        return self._items.pop(key, default)

    def clear(self) -> None:
        self._items.clear()
        self._sizes.clear()
        self.num_bytes = 0

    def values(self) -> list[V]:
        return list(self._items.values())

    def _over(self) -> bool:
        return (self.max_entries is not None and len(self._items) > self.max_entries
                or self.max_bytes is not None and self.num_bytes > self.max_bytes)
