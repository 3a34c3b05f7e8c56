"""One block's bytes: exact round trip, every layout field checked, corruption detected; the config fields."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hf_paged import PagedConfig
from hf_paged.errors import KVBlockCorruptError, KVBlockMismatchError, KVTransferError
from hf_paged.kv_transfer import BlockLayout, decode_block, encode_block, model_fingerprint
from tests.tiny_models import tiny_model

LAYOUT = BlockLayout("ab" * 16, 8, 2, 2, 8, "float32", "plain", "full")
DIGEST = bytes(range(16))
TOKENS = list(range(10, 18))


def tensors():
    g = torch.Generator().manual_seed(0)
    return [("0.k", torch.randn(8, 2, 8, generator=g)), ("0.v.data", torch.randint(-128, 127, (8, 2, 8),
             dtype=torch.int8, generator=g)), ("0.v.scale", torch.rand(8, 1, generator=g).half())]


def test_round_trip_is_exact_and_aligned():
    blob = encode_block(LAYOUT, DIGEST, TOKENS, tensors())
    block = decode_block(blob, LAYOUT, DIGEST, TOKENS)
    assert block.token_ids == tuple(TOKENS) and block.nbytes == len(blob)
    for name, t in tensors():
        assert block.tensors[name].dtype == t.dtype and torch.equal(block.tensors[name], t)


def test_decoding_touches_no_warning_filters(monkeypatch):
    """Blocks are decoded on the fetch worker's thread: `warnings.catch_warnings` there would swap the filters of
    every thread (a caller's `catch_warnings` or `pytest.warns` could lose a warning, or keep our filter). A
    read-only blob (`bytes`) is copied instead of silencing torch's warning about it."""
    import warnings

    def refuse(self):
        raise AssertionError("decode_block entered warnings.catch_warnings")

    blob = encode_block(LAYOUT, DIGEST, TOKENS, tensors())
    monkeypatch.setattr(warnings.catch_warnings, "__enter__", refuse)
    for data in (blob, bytearray(blob), memoryview(blob)):
        block = decode_block(data, LAYOUT, DIGEST, TOKENS)
        assert all(torch.equal(block.tensors[name], t) for name, t in tensors())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_half_and_eight_bit_floats_round_trip(dtype):
    t = torch.randn(8, 2, 8).to(dtype)
    block = decode_block(encode_block(LAYOUT, DIGEST, TOKENS, [("0.k", t)]), LAYOUT, DIGEST, TOKENS)
    assert block.tensors["0.k"].dtype == dtype and torch.equal(block.tensors["0.k"].view(torch.uint8),
                                                               t.view(torch.uint8))


@pytest.mark.parametrize("field", ["fingerprint", "block_size", "num_layers", "num_kv_heads", "head_dim", "dtype",
                                   "storage"])
def test_every_layout_field_must_match(field):
    value = getattr(LAYOUT, field)
    other = dataclasses.replace(LAYOUT, **{field: value + 1 if isinstance(value, int) else value + "x"})
    blob = encode_block(other, DIGEST, TOKENS, tensors())
    with pytest.raises(KVBlockMismatchError, match=field):
        decode_block(blob, LAYOUT, DIGEST, TOKENS)


def test_another_prefix_or_other_tokens_are_refused():
    blob = encode_block(LAYOUT, DIGEST, TOKENS, tensors())
    with pytest.raises(KVBlockMismatchError, match="prefix"):
        decode_block(blob, LAYOUT, bytes(16), TOKENS)
    with pytest.raises(KVBlockMismatchError, match="token ids"):
        decode_block(blob, LAYOUT, DIGEST, [1] * 8)


def test_a_header_longer_than_the_blob_is_corrupt():
    import struct
    import zlib

    body = b"HFPKVB01" + struct.pack("<I", 10**6) + b"{}"
    with pytest.raises(KVBlockCorruptError, match="header claims"):
        decode_block(body + struct.pack("<I", zlib.crc32(body)), LAYOUT, DIGEST, TOKENS)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_damage_is_detected(damage):
    blob = bytearray(encode_block(LAYOUT, DIGEST, TOKENS, tensors()))
    if damage == "flip":
        blob[200] ^= 1
    elif damage == "truncate":
        blob = blob[:-40]
    elif damage == "empty":
        blob = bytearray()
    else:
        blob = bytearray(b"not a block at all, just some bytes")
    with pytest.raises(KVBlockCorruptError) as info:
        decode_block(bytes(blob), LAYOUT, DIGEST, TOKENS)
    assert isinstance(info.value, KVTransferError) and isinstance(info.value, ValueError)


def test_fingerprint_is_stable_and_tells_weights_apart():
    a, b = tiny_model("llama", seed=0), tiny_model("llama", seed=0)
    assert model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(tiny_model("llama", seed=1))


def test_fingerprint_tells_another_rope_on_the_same_weights_apart():
    """A RoPE override (config and the inverse frequencies it recomputes) on the same weights computes other keys:
    a disk tier shared with it loaded them as its own (same fingerprint) and answered wrong."""
    base, same, theta, buffer = (tiny_model("llama", seed=0) for _ in range(4))
    theta.config.rope_parameters = {**theta.config.rope_parameters, "rope_theta": 1234.0}
    buffer.model.rotary_emb.inv_freq.mul_(0.5)
    fingerprints = [model_fingerprint(m) for m in (base, same, theta, buffer)]
    assert fingerprints[0] == fingerprints[1] and len(set(fingerprints)) == 3
    same.config._name_or_path = "/elsewhere"  # naming fields do not count
    assert model_fingerprint(same) == fingerprints[0]


def test_config_fields_are_checked():
    assert PagedConfig(kv_offload_dir="/tmp/kv", kv_offload_bytes=10).kv_offload_bytes == 10
    with pytest.raises(ValueError, match="kv_offload_bytes"):
        PagedConfig(kv_offload_bytes=0)
    with pytest.raises(ValueError, match="kv_offload_dir"):
        PagedConfig(kv_offload_dir=5)
    with pytest.raises(ValueError, match="enable_prefix_caching=True"):
        PagedConfig(kv_offload_dir="/tmp/kv", enable_prefix_caching=False)
