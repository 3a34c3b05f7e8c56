"""The weights checksum weights each chunk of a large tensor by its place: two chunks trading places (two halves of a
fused projection stored the other way round) change the model fingerprint, as any moved value does."""

from __future__ import annotations

import torch

from hf_paged.kv_transfer.weights_checksum import _CHUNK, tensor_checksum


def test_two_whole_chunks_trading_places_change_the_checksum():
    g = torch.Generator().manual_seed(3)
    big = torch.randn(2 * _CHUNK, generator=g)
    swapped = torch.cat([big[_CHUNK:], big[:_CHUNK]])
    assert tensor_checksum(swapped) != tensor_checksum(big)
    assert tensor_checksum(big.clone()) == tensor_checksum(big)
