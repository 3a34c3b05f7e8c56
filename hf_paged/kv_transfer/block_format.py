"""One KV block as bytes: a header naming its layout and prefix, its tensors as stored, a checksum. No pickle.

    b"HFPKVB01" | header length (u32 LE) | header (JSON, padded to 16 bytes) | tensors (each 16-byte aligned)
    | CRC-32 of everything before it (4 bytes, little-endian)

The header holds the `BlockLayout` (model fingerprint, block size, layers, KV heads, head size, dtype, storage
format), the block's digest and token ids, and the tensor table: name, dtype, shape, in payload order. The tensors
are the engine's own storage of the block (`PagedCache.save_blocks`, the swap format): plain K/V in the model
dtype, or quantized parts with their scales exactly as stored. Decoding checks the checksum first (a truncated or
altered blob is `KVBlockCorruptError`), then the layout and the prefix (`KVBlockMismatchError`): a block is
loaded only when every field agrees. The checksum guards against accidents (a torn write, a bad sector, a file cut
short), not against a writer that means harm (who could write a valid checksum of any kind), so it is CRC-32: 5x
faster than blake2b here (8 ms vs 37 ms for a 2k-token prefix of a 58M model), which is most of a load's time.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hf_paged.errors import KVBlockCorruptError, KVBlockMismatchError
from hf_paged.kv_transfer.layout import BlockLayout

__all__ = ["DecodedBlock", "decode_block", "encode_block"]

MAGIC = b"HFPKVB01"
_CHECKSUM = 4
_ALIGN = 16
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, *(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)),
)}
_ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in _DTYPES.values()}


@dataclass(slots=True)
class DecodedBlock:
    """A block read back: its tensors by name (views into one buffer), ready to be stacked with others."""

    digest: bytes
    token_ids: tuple[int, ...]
    tensors: dict[str, torch.Tensor]  # read-only views into the blob
    nbytes: int  # size of the encoded blob


def _pad(n: int) -> int:
    return -n % _ALIGN


def _checksum(data) -> bytes:
    return struct.pack("<I", zlib.crc32(data))


def encode_block(layout: BlockLayout, digest: bytes, token_ids: Sequence[int],
                 tensors: Sequence[tuple[str, torch.Tensor]]) -> bytes:
    """The bytes of one block: `tensors` (name, CPU tensor) as stored, under a header naming `layout`, the block's
    `digest` and `token_ids`."""
    table, payload = [], []
    for name, t in tensors:
        raw = t.detach().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        table.append([name, str(t.dtype).removeprefix("torch."), list(t.shape)])
        payload += [raw, b"\0" * _pad(len(raw))]
    header = json.dumps({"layout": layout.to_dict(), "digest": digest.hex(), "token_ids": list(map(int, token_ids)),
                         "tensors": table}, separators=(",", ":")).encode()
    head = MAGIC + struct.pack("<I", len(header) + _pad(len(MAGIC) + 4 + len(header)))
    body = b"".join([head, header, b" " * _pad(len(head) + len(header)), *payload])
    return body + _checksum(body)


def decode_block(data: bytes | bytearray | memoryview, layout: BlockLayout, digest: bytes,
                 token_ids: Sequence[int] | None = None) -> DecodedBlock:
    """Read a block encoded by `encode_block`, checking that it is whole (checksum), made for `layout`, and holds
    the block `digest` (and `token_ids`, when given). Raises `KVBlockCorruptError` or `KVBlockMismatchError`."""
    view = memoryview(data).cast("B")
    size = len(view)
    if size < len(MAGIC) + 4 + _CHECKSUM or bytes(view[: len(MAGIC)]) != MAGIC:
        raise KVBlockCorruptError(f"not a KV block ({size} bytes, no {MAGIC!r} header): truncated or another file")
    if _checksum(view[:-_CHECKSUM]) != bytes(view[-_CHECKSUM:]):
        raise KVBlockCorruptError(f"KV block checksum mismatch ({size} bytes): truncated or altered")
    (header_len,) = struct.unpack_from("<I", view, len(MAGIC))
    start = len(MAGIC) + 4 + header_len
    if start > size - _CHECKSUM:
        raise KVBlockCorruptError(f"KV block header claims {header_len} bytes of a {size}-byte blob")
    try:
        header = json.loads(bytes(view[len(MAGIC) + 4 : start]))
        table = [(str(n), _DTYPES[d], tuple(int(x) for x in shape)) for n, d, shape in header["tensors"]]
        stored_layout, stored_digest = dict(header["layout"]), bytes.fromhex(header["digest"])
        stored_tokens = tuple(int(t) for t in header["token_ids"])
    except (ValueError, KeyError, TypeError) as exc:
        raise KVBlockCorruptError(f"KV block header unreadable: {exc}") from exc
    layout.check(stored_layout)
    if stored_digest != digest:
        raise KVBlockMismatchError(f"stored KV block holds prefix {stored_digest.hex()}, asked for {digest.hex()}: "
                                   "a misplaced file; it is not loaded")
    if token_ids is not None and stored_tokens != tuple(map(int, token_ids)):
        raise KVBlockMismatchError("stored KV block holds other token ids than the prompt's block (a digest "
                                   "collision or a misplaced file); it is not loaded")
    buffer = _bytes_tensor(view[start : size - _CHECKSUM])
    tensors, offset = {}, 0
    for name, dtype, shape in table:
        count = torch.Size(shape).numel() * _ITEMSIZE[dtype]
        if offset + count > len(buffer):
            raise KVBlockCorruptError(f"KV block payload too short for tensor {name!r} {shape} {dtype}")
        tensors[name] = buffer[offset : offset + count].view(dtype).view(shape)
        offset += count + _pad(count)
    if offset != len(buffer):
        raise KVBlockCorruptError(f"KV block payload holds {len(buffer)} bytes, its table {offset}")
    return DecodedBlock(stored_digest, stored_tokens, tensors, size)


def _bytes_tensor(payload: memoryview) -> torch.Tensor:
    """A uint8 tensor over `payload`, copied first when it is read-only (a `bytes` blob): torch warns on a read-only
    buffer, and silencing that with `warnings.catch_warnings` here, on the fetch worker's thread, would swap the
    warning filters of every thread (a caller's own `catch_warnings` could lose its warnings, or keep ours). The
    copy is one pass over bytes the checksum has just read."""
    if len(payload) == 0:
        return torch.empty(0, dtype=torch.uint8)
    if payload.readonly:
        payload = memoryview(bytearray(payload))
    return torch.frombuffer(payload, dtype=torch.uint8)
