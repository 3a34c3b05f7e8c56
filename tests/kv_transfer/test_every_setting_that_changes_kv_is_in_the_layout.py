"""Every engine setting that changes the K/V a prefill computes for the same weights and tokens (quantized storage
and its full-precision heads, token pruning and each of its numbers, sparse prefill, head merging) gives another
block layout: another store namespace (the blocks are never even looked up) and a header the other engine refuses."""

from __future__ import annotations

import itertools
import struct
import zlib

import pytest

from hf_paged import Engine, PagedConfig
from hf_paged.errors import KVBlockCorruptError, KVBlockMismatchError
from hf_paged.kv_transfer import InProcessStore, decode_block
from hf_paged.kv_transfer.block_format import MAGIC
from tests.kv_transfer.test_engine_transfer import BS

SETTINGS = {
    "plain": {},
    "int8": {"kv_cache_dtype": "int8"},
    "int8 + a full head": {"kv_cache_dtype": "int8", "kv_full_precision_heads": ((0,), ())},
    "snapkv keep 1/2": {"kv_pruning": "snapkv", "kv_keep_ratio": 0.5},
    "snapkv keep 1/4": {"kv_pruning": "snapkv", "kv_keep_ratio": 0.25},
    "sparse prefill": {"sparse_prefill": "block"},
    "head merge": {"head_merge": ((0, 0, 0, 0), (0, 1, 0, 1))},
}


def test_each_setting_has_a_layout_of_its_own(model):
    layouts = {name: Engine(model, PagedConfig(block_size=BS, **cfg), kv_store=InProcessStore())
               .scheduler.kv_transfer.layout() for name, cfg in SETTINGS.items()}
    for (a, ours), (b, theirs) in itertools.combinations(layouts.items(), 2):
        assert ours.namespace() != theirs.namespace(), (a, b)
        with pytest.raises(KVBlockMismatchError):
            ours.check(theirs.to_dict())


def test_a_header_length_reaching_into_the_checksum_is_corrupt(model):
    layout = Engine(model, PagedConfig(block_size=BS), kv_store=InProcessStore()).scheduler.kv_transfer.layout()
    body = MAGIC + struct.pack("<I", 4) + b"{}"  # the header would take 2 of the checksum's 4 bytes
    with pytest.raises(KVBlockCorruptError, match="header claims"):
        decode_block(body + struct.pack("<I", zlib.crc32(body)), layout, b"\0" * 16)

