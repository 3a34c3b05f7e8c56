"""A stored block is written into the pool only when its tensors are exactly what this engine stores for a block
(names, dtypes, shapes), even under a header naming this engine's layout: the pool's indexed write would broadcast a
narrower key tensor over every KV head, or cast another dtype, without a word. Such a block is refused, counted,
deleted and recomputed; and a blob whose payload holds more than its tensor table is corrupt."""

from __future__ import annotations

import struct
import zlib

import pytest
import torch

from hf_paged import Engine, PagedConfig
from hf_paged.errors import KVBlockCorruptError
from hf_paged.kv_transfer import InProcessStore, decode_block, encode_block
from tests.kv_transfer.test_engine_transfer import BS, run, transfer_stats


def _rewrite(store, layout, change):
    """Every blob of `store` encoded again under its own header, its tensors passed through `change`."""
    for key, blob in list(store._blobs.items()):
        block = decode_block(blob, layout, key[8:])
        tensors = [(name, change(name, t)) for name, t in block.tensors.items()]
        store._blobs[key] = encode_block(layout, block.digest, block.token_ids, tensors)


@pytest.mark.parametrize("change", [
    lambda name, t: t[:, :1] if name == "0.k" else t,  # one KV head of keys: would be broadcast over both
    lambda name, t: t.half() if name == "1.v" else t,  # another dtype: would be cast
], ids=["narrower", "dtype"])
def test_a_block_of_another_table_is_refused_and_recomputed(model, prompts, expected, change):
    store = InProcessStore()
    saver = Engine(model, PagedConfig(block_size=BS), kv_store=store)
    run(saver, prompts[:1])
    _rewrite(store, saver.scheduler.kv_transfer.layout(), change)
    engine = Engine(model, PagedConfig(block_size=BS), kv_store=store)
    assert run(engine, prompts[:1]) == expected[:1]
    stats = transfer_stats(engine)
    assert stats == {**stats, "loaded_blocks": 0, "rejected_blocks": 5, "load_failures": 1}
    again = Engine(model, PagedConfig(block_size=BS), kv_store=store)  # the refused blobs were deleted, and the
    assert run(again, prompts[:1]) == expected[:1]  # engine's own computed blocks saved in their place
    assert transfer_stats(again)["loaded_blocks"] == 5


def test_a_payload_longer_than_its_table_is_corrupt(model):
    layout = Engine(model, PagedConfig(block_size=BS), kv_store=InProcessStore()).scheduler.kv_transfer.layout()
    digest, tokens = b"\1" * 16, list(range(BS))
    blob = encode_block(layout, digest, tokens, [("0.k", torch.zeros(2, 2))])
    assert decode_block(blob, layout, digest).tensors["0.k"].shape == (2, 2)
    longer = blob[:-4] + bytes(16)  # 16 more payload bytes than the table names, under a valid checksum
    longer += struct.pack("<I", zlib.crc32(longer))
    with pytest.raises(KVBlockCorruptError, match="payload holds"):
        decode_block(longer, layout, digest)
