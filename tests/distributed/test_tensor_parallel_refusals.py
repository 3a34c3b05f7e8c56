"""`check_tensor_parallel` refuses, without processes, every setup it names: a boolean parallelism flag set to True
beside tensor parallelism (sequence parallelism), and both KV pruning modes that score heads (SnapKV and PyramidKV)."""

from __future__ import annotations

import pytest

import hf_paged
from hf_paged.distributed.tensor_parallel import check_tensor_parallel
from tests.distributed.test_tensor_parallel import _FakeTensorParallel


def test_sequence_parallelism_beside_tensor_parallelism_is_refused():
    with pytest.raises(hf_paged.errors.UnsupportedModelError, match="enable_sequence_parallel=True"):
        check_tensor_parallel(_FakeTensorParallel(2, 2, enable_sequence_parallel=True), hf_paged.PagedConfig())
    check_tensor_parallel(_FakeTensorParallel(2, 2, enable_sequence_parallel=False), hf_paged.PagedConfig())


@pytest.mark.parametrize("mode", ["snapkv", "pyramidkv"])
def test_head_scored_kv_pruning_is_refused(mode):
    config = hf_paged.PagedConfig(kv_pruning=mode, kv_keep_ratio=0.5)  # (alone, kv_pruning is refused as idle)
    with pytest.raises(hf_paged.errors.InvalidConfigError, match=f"kv_pruning='{mode}'.*tensor parallelism"):
        check_tensor_parallel(_FakeTensorParallel(2, 2), config)
