"""Block digests: the identity of a full block, chained over its prefix, the same in every process. No torch.

    digest(block i) = blake2b(digest(block i - 1) | None, token ids of block i, extra keys)

A block's KV depends on every token before it, so its digest chains its parent's. Extra keys (an adapter's name, a
cache salt) are encoded type-tagged and length-prefixed, never with `hash()` (salted per process), so replicas and
ranks agree on a prompt's digests (`prefix_digests`: routing, sharding). The prefix cache (`radix.py`) keys its
nodes by them and verifies a hit on the tokens.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

__all__ = ["block_digest", "chained_digest", "encode_extra_keys", "prefix_digests"]

_DIGEST_SIZE = 16  # 128 bits: collisions are negligible, and hits are verified on the tokens anyway


def _encode_key(key: Any, out: bytearray) -> None:
    # Type-tagged and length-prefixed so that ("a", "bc") and ("ab", "c") differ; never `hash()` (salted per process).
    if key is None:
        out += b"N"
    elif isinstance(key, bool):
        out += b"T" if key else b"F"
    elif isinstance(key, int):
        raw = key.to_bytes((key.bit_length() + 8) // 8, "little", signed=True)
        out += b"I" + len(raw).to_bytes(2, "little") + raw
    elif isinstance(key, float):
        out += b"D" + struct.pack("<d", key)
    elif isinstance(key, (str, bytes)):
        raw = key.encode() if isinstance(key, str) else key
        out += (b"S" if isinstance(key, str) else b"Y") + len(raw).to_bytes(8, "little") + raw
    elif isinstance(key, (tuple, list)):
        out += b"(" + len(key).to_bytes(8, "little")
        for item in key:
            _encode_key(item, out)
    else:
        raise TypeError(
            f"extra key of type {type(key).__name__} cannot be hashed stably across processes; "
            "pass str, bytes, int, float, bool, None or tuples of them (e.g. the adapter's name, not the adapter)"
        )


def encode_extra_keys(extra_keys: tuple) -> bytes:
    """The extra keys as the bytes every digest of a sequence hashes."""
    out = bytearray()
    _encode_key(tuple(extra_keys), out)
    return bytes(out)


def chained_digest(parent: bytes | None, token_ids: tuple[int, ...], extra: bytes) -> bytes:
    """`block_digest` with the extra keys already encoded (`encode_extra_keys`): the tree's walks encode them once."""
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE, person=b"hf_paged.block")
    h.update(b"\x00" if parent is None else b"\x01" + parent)
    h.update(len(token_ids).to_bytes(4, "little"))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(extra)
    return h.digest()


def block_digest(parent: bytes | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> bytes:
    """The identity of one block: blake2b over (parent digest, token ids, extra keys); the same in every process.

    Args:
        parent: digest of the previous block of the sequence, `None` for the first block.
        token_ids: the block's token ids.
        extra_keys: what else the KV depends on (adapter name, cache salt); str/bytes/int/float/bool/None/tuples.

    Example:
        >>> first = block_digest(None, [1, 2, 3, 4])
        >>> block_digest(first, [5, 6, 7, 8]) != block_digest(None, [5, 6, 7, 8])
        True
    """
    return chained_digest(parent, tuple(map(int, token_ids)), encode_extra_keys(extra_keys))


def prefix_digests(token_ids: Sequence[int], block_size: int, extra_keys: tuple = ()) -> list[bytes]:
    """Chained digests of every full block of `token_ids` (e.g. for routing a request to the replica holding it)."""
    extra, parent, digests = encode_extra_keys(extra_keys), None, []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chained_digest(parent, tuple(map(int, token_ids[start : start + block_size])), extra)
        digests.append(parent)
    return digests
