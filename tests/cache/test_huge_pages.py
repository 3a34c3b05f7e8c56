"""Pool storage on 2 MiB-aligned memory with huge pages requested: right shape and contents, never a failure."""

import sys

import pytest
import torch

from hf_paged.cache.huge_pages import HUGE_PAGE_BYTES, huge_pages_in_use, pool_empty, thp_mode


def test_thp_mode_reads_the_bracketed_policy(tmp_path):
    enabled = tmp_path / "enabled"
    enabled.write_text("always [madvise] never\n")
    assert thp_mode(str(enabled)) == "madvise"
    enabled.write_text("[never]\n")
    assert thp_mode(str(enabled)) == "never"
    assert thp_mode(str(tmp_path / "missing")) is None
    enabled.write_text("garbage\n")
    assert thp_mode(str(enabled)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_pool_tensor_is_usable_and_aligned_where_requested(dtype):
    shape = (5, 16, 2, 8)
    pool, how = pool_empty(shape, dtype)
    assert tuple(pool.shape) == shape and pool.dtype == dtype and pool.is_contiguous()
    pool.fill_(3)
    assert bool((pool == 3).all())
    pool[2, 7] = 1  # a block row written through an index, as the store does
    assert int((pool == 1).sum()) == 2 * 8
    if how.aligned:  # Linux with THP not "never"
        assert pool.data_ptr() % HUGE_PAGE_BYTES == 0 and how.thp_mode in ("always", "madvise")
    else:
        assert not how.huge_pages_requested


def test_plain_memory_when_not_asked_or_not_cpu():
    pool, how = pool_empty((4, 4), torch.float32, huge_pages=False)
    assert not how.aligned and not how.huge_pages_requested and tuple(pool.shape) == (4, 4)
    meta, how = pool_empty((4, 4), torch.float32, "meta")
    assert meta.device.type == "meta" and not how.aligned


def test_memory_outlives_the_allocator_frame():
    """The mmap region is owned by the tensor: views stay valid after every other reference is gone."""
    pool, _ = pool_empty((64, 16, 4, 8), torch.float32)
    view = pool[10:12]
    del pool
    view.fill_(7.0)
    assert float(view.sum()) == 7.0 * view.numel()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="AnonHugePages is a Linux counter")
def test_huge_pages_counter_reads():
    value = huge_pages_in_use()
    assert value is None or value >= 0


def test_engine_on_huge_page_pools_keeps_parity():
    from hf_paged import Engine, PagedConfig, SamplingParams
    from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

    model = tiny_model("llama")
    prompts = ragged_prompts([5, 40, 23], seed=3)
    engine = Engine(model, PagedConfig(kv_huge_pages=True, num_blocks=64, max_num_batched_tokens=24))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=12)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    assert [engine.pop_output(i).generated_tokens for i in ids] == stock_greedy(model, prompts, 12)
    layer = engine.cache.block_layers[0]
    if thp_mode() in ("always", "madvise"):
        assert layer.key_cache.data_ptr() % HUGE_PAGE_BYTES == 0 and layer.value_cache.data_ptr() % HUGE_PAGE_BYTES == 0
    with pytest.raises(TypeError, match="kv_huge_pages must be True or False"):
        PagedConfig(kv_huge_pages="yes")


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="pools are 2 MiB-aligned only where THP is on")
@pytest.mark.parametrize("overrides", [{"kv_cache_dtype": "int8"}, {"value_cache_dtype": "int4"},
                                       {"head_merge": ((0, 0, 2, 2), (0, 1, 0, 1))}])
def test_quantized_and_merged_pools_honour_huge_pages(overrides):
    """kv_huge_pages reaches every pool kind (the h7 pass: quantized and merged layers took plain memory, silently),
    and their output stays what it is without it."""
    from hf_paged import Engine, PagedConfig
    from tests.tiny_models import ragged_prompts, run_engine, tiny_model

    model = tiny_model("llama")
    prompts = ragged_prompts([5, 40], seed=3)
    outs = []
    for huge in (False, True):
        engine = Engine(model, PagedConfig(kv_huge_pages=huge, num_blocks=64, block_size=16, **overrides))
        outs.append(run_engine(engine, prompts, 6))
    assert outs[0] == outs[1]
    layer = engine.cache.block_layers[0]
    pools = ([layer.key_cache, layer.value_cache] if "head_merge" in overrides
             else [t for store in layer.stores for t in store.parts.values()])
    assert pools and all(t.data_ptr() % HUGE_PAGE_BYTES == 0 for t in pools)
