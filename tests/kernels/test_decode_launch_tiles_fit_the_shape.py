"""The decode launch's tiles follow the shape (`launch.decode_launch_config`): a GQA group past 16 query heads per KV
head (multi-query models: 71 heads over 1 in Falcon-7B) gets a power-of-two row tile (`tl.arange` and `tl.dot`
take nothing else), and a short context a key tile no longer than it needs."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels import launch


def _config(num_heads, num_kv_heads, max_context_len):
    return launch.decode_launch_config(num_seqs=4, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=64,
                                       max_context_len=max_context_len, dtype=torch.float16, num_sms=132)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "block_g"), [(8, 2, 16), (48, 2, 32), (71, 1, 128),
                                                                     (64, 2, 32)])
def test_a_large_gqa_group_gets_a_power_of_two_row_tile(num_heads, num_kv_heads, block_g):
    assert _config(num_heads, num_kv_heads, 4096).block_g == block_g


@pytest.mark.parametrize(("max_context_len", "block_n"), [(1, 16), (20, 32), (33, 64), (4096, 64)])
def test_a_short_context_gets_a_short_key_tile(max_context_len, block_n):
    assert _config(8, 2, max_context_len).block_n == block_n
