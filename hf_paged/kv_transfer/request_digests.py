"""A waiting request's block digests, hashed once: admission asks the store about the same prompt at every step
while the request waits (a long queue asked every considered prompt's digests again each step).

    digests(seq, tokens) -> the chained digests of tokens' full blocks; the blocks hashed before are reused when the
                            remembered tokens are a prefix of `tokens` (a request's tokens only grow), the rest
                            chained on from the last one
    forget(seq)          -> dropped when the request starts or leaves

The remembered tokens are compared with the asked ones (a C-level list compare, far cheaper than hashing), so a
sequence id reused for other tokens is hashed anew, never answered with another prompt's digests.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hf_paged.cache.digests import chained_digest, encode_extra_keys

__all__ = ["RequestDigests"]


@dataclass(slots=True)
class _Entry:
    extra_keys: tuple
    token_ids: list[int]  # the full blocks' tokens hashed so far
    digests: list[bytes]


class RequestDigests:
    """Digests of waiting sequences, by sequence id. `hashed_blocks` counts the blocks hashed (tests, stats)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._entries: dict[Hashable, _Entry] = {}
        self.hashed_blocks = 0

    def __len__(self) -> int:
        return len(self._entries)

    def digests(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple = ()) -> list[bytes]:
        """The digests of the full blocks of `token_ids` (a partial last block is not hashed)."""
        bs = self.block_size
        num_blocks = len(token_ids) // bs
        entry = self._entries.get(seq_id)
        overlap = min(len(entry.token_ids), num_blocks * bs) if entry is not None else 0
        if entry is None or entry.extra_keys != extra_keys or (
                list(token_ids[:overlap]) != entry.token_ids[:overlap]):
            entry = self._entries[seq_id] = _Entry(extra_keys, [], [])
        before = len(entry.digests)
        if before < num_blocks:
            extra = encode_extra_keys(extra_keys)
            parent = entry.digests[-1] if entry.digests else None
            for i in range(before, num_blocks):
                parent = chained_digest(parent, tuple(int(t) for t in token_ids[i * bs : (i + 1) * bs]), extra)
                entry.digests.append(parent)
            entry.token_ids = [int(t) for t in token_ids[: num_blocks * bs]]
            self.hashed_blocks += num_blocks - before
        return entry.digests[:num_blocks]

    def forget(self, seq_id: Hashable) -> None:
        self._entries.pop(seq_id, None)
