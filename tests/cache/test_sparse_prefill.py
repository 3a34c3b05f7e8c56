"""Block-sparse prefill (`PagedConfig.sparse_prefill`): the selection, the kernel, the backends' hook, the exact path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_paged import Engine, PagedConfig
from hf_paged.cache import attention_backends
from hf_paged.cache.kernels.block_sparse import (
    SPARSE_BLOCK,
    TILE_QUERY_BLOCKS,
    block_sparse_attention,
    visible_blocks,
)
from hf_paged.cache.sparse_prefill import SPARSE_PATTERNS, SparsePrefill, select_blocks
from tests.tiny_models import run_engine, tiny_model

PATTERNS = list(SPARSE_PATTERNS)


def _dense(q, k, v, scale):
    c, q_len = k.shape[0], q.shape[0]
    mask = torch.arange(c)[None, :] <= torch.arange(c - q_len, c)[:, None]
    return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                          attn_mask=mask, scale=scale, enable_gqa=True)[0].transpose(0, 1)


def _qkv(context_len, q_len, heads=4, kv_heads=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(q_len, heads, dim, generator=g), torch.randn(context_len, kv_heads, dim, generator=g),
            torch.randn(context_len, kv_heads, dim, generator=g))


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize(("context_len", "q_len"), [(300, 300), (1000, 200), (777, 130), (64, 64), (200, 64)])
def test_every_block_kept_is_dense_attention(pattern, context_len, q_len):
    q, k, v = _qkv(context_len, q_len)
    selection = select_blocks(q, k, pattern, 1.0, scale=0.25)
    assert selection.kept_share(context_len, q_len) == 1.0
    torch.testing.assert_close(block_sparse_attention(q, k, v, selection, scale=0.25), _dense(q, k, v, 0.25),
                               atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_small_keep_ratio_keeps_sink_local_and_the_ratio(pattern):
    context_len, q_len = 2048, 1024
    q, k, v = _qkv(context_len, q_len)
    selection = select_blocks(q, k, pattern, 0.25, scale=0.25)
    nqb = q_len // SPARSE_BLOCK
    visible = visible_blocks(context_len, q_len, nqb, torch.device("cpu"))
    assert selection.blocks.shape[0] == 2  # one selection per KV head
    for i in range(nqb):
        local = list(range(int(selection.local_first[i]), int(visible[i])))
        assert local[-1] == (context_len - q_len) // SPARSE_BLOCK + i  # its own block
        tile = slice(i - i % TILE_QUERY_BLOCKS, i - i % TILE_QUERY_BLOCKS + TILE_QUERY_BLOCKS)
        for h in range(2):
            kept = selection.blocks[h, i, : int(selection.keep[h, i])].tolist()
            assert 0 in kept  # the sink
            assert not set(kept) & set(local) and len(set(kept)) == len(kept)
            assert len(kept) + len(local) >= max(-(-int(visible[i]) // 4), len(local) + 1)
            assert int(selection.keep[h, i]) == int(selection.keep[h, tile].max())  # a tile keeps one count
    assert 0.2 < selection.kept_share(context_len, q_len) < 0.35
    out = block_sparse_attention(q, k, v, selection, scale=0.25)
    assert out.shape == q.shape and bool(torch.isfinite(out).all())


def test_a_block_scored_high_is_kept():
    """Keys of one distant block aligned with every query: both estimates find it."""
    q, k, _ = _qkv(2048, 512)
    direction = torch.randn(16, generator=torch.Generator().manual_seed(5))
    q += 3 * direction
    k[640:704] += 3 * direction  # block 10
    for pattern in PATTERNS:
        selection = select_blocks(q, k, pattern, 0.2, scale=0.25)  # room for 2 besides sink + local
        for h in range(2):
            for i in range(8):
                assert 10 in selection.blocks[h, i, : int(selection.keep[h, i])].tolist(), (pattern, h, i)


def test_bad_settings_raise_typed_errors():
    with pytest.raises(ValueError, match=r"sparse_keep_ratio must be in \(0, 1\]"):
        PagedConfig(sparse_prefill="block", sparse_keep_ratio=0.0)
    with pytest.raises(ValueError, match=r"sparse_keep_ratio must be in \(0, 1\]"):
        PagedConfig(sparse_keep_ratio=1.5)
    with pytest.raises(ValueError, match=r"sparse_keep_ratio must be in \(0, 1\]"):
        PagedConfig(sparse_keep_ratio=float("nan"))
    with pytest.raises(TypeError, match="sparse_keep_ratio must be a float"):
        PagedConfig(sparse_keep_ratio="0.5")
    with pytest.raises(ValueError, match="sparse_prefill must be one of"):
        PagedConfig(sparse_prefill="dense")
    with pytest.raises(ValueError, match="sparse_prefill_min_tokens must be >= 1"):
        PagedConfig(sparse_prefill_min_tokens=0)
    q, k, _ = _qkv(128, 128)
    with pytest.raises(ValueError, match=r"sparse_keep_ratio must be in \(0, 1\]"):
        select_blocks(q, k, "block", 0, scale=1.0)
    with pytest.raises(ValueError, match="pattern must be one of"):
        select_blocks(q, k, "slash", 0.5, scale=1.0)
    assert SparsePrefill.from_config(PagedConfig()) is None


def _run(model, prompts, max_new_tokens, **config) -> list[list[int]]:
    return run_engine(Engine(model, PagedConfig(block_size=16, **config)), prompts, max_new_tokens)


@pytest.fixture(scope="module")
def stock_run():
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 96, (n,), generator=g).tolist() for n in (300, 200, 40)]
    stock = [model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p):].tolist()
             for p in prompts]
    return model, prompts, stock


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_greedy_with_every_block_kept_equals_stock(monkeypatch, stock_run, backend, pattern):
    """The exact path: keep ratio 1 through the engine (chunked prefill, a short prompt beside the long ones, decodes
    in the same steps) gives stock generate's greedy tokens, and the sparse path did run."""
    calls = []
    real = attention_backends.attend_sparse_groups

    def counting(sparse, groups, *args, **kwargs):
        calls.append(len(groups))
        return real(sparse, groups, *args, **kwargs)

    monkeypatch.setattr(attention_backends, "attend_sparse_groups", counting)
    model, prompts, stock = stock_run
    outs = _run(model, prompts, 12, max_num_batched_tokens=256, attention_backend=backend, sparse_prefill=pattern,
                sparse_prefill_min_tokens=128, sparse_keep_ratio=1.0)
    assert outs == stock
    assert calls  # some chunks went through the block-sparse path


def test_sparse_prefill_runs_through_the_engine_and_keeps_short_prompts_exact(stock_run):
    """A small keep ratio changes only the long prompt (the short ones never reach the threshold)."""
    model, prompts, stock = stock_run
    outs = _run(model, prompts, 12, sparse_prefill="auto", sparse_prefill_min_tokens=250, sparse_keep_ratio=0.3)
    assert outs[1:] == stock[1:]
    assert len(outs[0]) == 12


@pytest.mark.parametrize("overrides, field", [
    ({"kv_cache_dtype": "int8"}, "kv_cache_dtype"),
    ({"value_cache_dtype": "int4"}, "value_cache_dtype"),
    ({"kv_cache_dtype": "int8", "key_cache_dtype": "auto", "value_cache_dtype": "fp8"}, "value_cache_dtype"),
    ({"head_merge": ((0, 0, 2, 2), (0, 1, 2, 3))}, "sparse_prefill"),
])
def test_sparse_prefill_beside_dense_only_layers_is_refused(overrides, field):
    """Quantized and merged layers attend densely: sparse prefill beside them would do nothing (the h7 pass: accepted,
    output bit-identical to the same config without it)."""
    with pytest.raises(ValueError, match=rf"sparse_prefill.*{field}|{field}.*sparse_prefill|head_merge.*{field}"):
        PagedConfig(sparse_prefill="block", **overrides)
    PagedConfig(sparse_prefill="block", kv_cache_dtype="int8", key_cache_dtype="auto", value_cache_dtype="auto")


def test_sparse_prefill_on_the_stock_cache_path_is_refused():
    """The stock `cache=` path attends with stock attention (dense): refused like kv_pruning there, naming the field
    and `hf_paged.wrap` (the h7 pass: accepted, scores bit-identical to dense)."""
    from hf_paged import PagedCache

    model = tiny_model("llama")
    cache = PagedCache(model.config, PagedConfig(num_blocks=32, sparse_prefill="vertical_slash",
                                                 sparse_prefill_min_tokens=64))
    refused = r"sparse_prefill='vertical_slash' needs the hf_paged attention.*hf_paged.wrap"
    with pytest.raises(ValueError, match=refused):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, cache=cache)
