import pytest

from hf_paged import PagedConfig
from hf_paged.errors import InvalidConfigError


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("block_size", 0, "block_size"),
        ("block_size", 12, "power of two"),
        ("num_blocks", -1, "num_blocks"),
        ("max_cache_bytes", 0, "max_cache_bytes"),
        ("max_num_seqs", 0, "max_num_seqs"),
        ("max_num_batched_tokens", -5, "max_num_batched_tokens"),
        ("kv_cache_dtype", "int3", "kv_cache_dtype.*'int8'"),
        ("preemption_mode", "drop", "preemption_mode"),
        ("kv_keep_ratio", 0.0, "kv_keep_ratio"),
        ("attention_backend", "cuda", "attention_backend"),
    ],
)
def test_invalid_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        PagedConfig(**{field: value})


def test_types_and_overrides():
    with pytest.raises(TypeError, match="block_size must be an int"):
        PagedConfig(block_size="16")
    cfg = PagedConfig().with_overrides(block_size=32)
    assert cfg.block_size == 32
    with pytest.raises(TypeError, match="unknown PagedConfig field"):
        PagedConfig().with_overrides(blocksize=32)
    assert PagedConfig(kv_cache_dtype="int8", value_cache_dtype="int4").value_dtype == "int4"


@pytest.mark.parametrize(("kwargs", "needs"), [
    ({"kv_keep_ratio": 0.5}, "kv_pruning"),
    ({"kv_budget_tokens": 512}, "kv_pruning"),
    ({"num_sink_tokens": 4}, "kv_pruning or kv_streaming_heads"),
    ({"window_tokens": 64}, "kv_pruning or kv_streaming_heads"),
    ({"prefix_eviction_policy": "cost", "enable_prefix_caching": False}, "enable_prefix_caching=True"),
    ({"max_prefill_tokens_per_step": 64, "enable_chunked_prefill": False}, "enable_chunked_prefill=True"),
    ({"kv_full_precision_heads": ((0,),)}, "a kv_cache_dtype"),
    ({"value_quant_group": "head"}, "a value_cache_dtype"),
    ({"kv_scale_format": "log8"}, "a kv_cache_dtype"),
    ({"kv_pruning": "snapkv"}, "kv_keep_ratio < 1 or kv_budget_tokens"),
    ({"kv_pruning": "pyramidkv"}, "kv_keep_ratio < 1 or kv_budget_tokens"),  # (h7: it dropped nothing, accepted)
    ({"sparse_keep_ratio": 0.5}, "sparse_prefill"),  # (h7 F11)
    ({"sparse_prefill_min_tokens": 100}, "sparse_prefill"),
])
def test_a_field_nothing_reads_is_refused(kwargs, needs):
    """Each ran as if unset (the output equal to the defaults'), with no word."""
    name = next(iter(kwargs))
    with pytest.raises(InvalidConfigError, match=f"PagedConfig.{name}=.* does nothing here: it acts only with {needs}"):
        PagedConfig(**kwargs)


def test_the_same_fields_with_what_reads_them_are_taken():
    PagedConfig(kv_pruning="snapkv", kv_keep_ratio=0.5, kv_budget_tokens=64, num_sink_tokens=4, window_tokens=32)
    PagedConfig(kv_pruning="pyramidkv", kv_budget_tokens=512)
    PagedConfig(kv_pruning="streaming")  # keep ratio 1: a rolling budget of the prompt's length as output grows
    PagedConfig(kv_cache_dtype="int8", value_quant_group="head", kv_scale_format="log8")
    PagedConfig(prefix_eviction_policy="cost", max_prefill_tokens_per_step=64)
    with pytest.raises(ValueError, match="kv_keep_ratio"):
        PagedConfig(kv_pruning="snapkv", kv_keep_ratio=True)  # a bool is no ratio


def test_an_empty_cache_salt_is_refused_and_equal_head_tables_are_one_layout():
    """cache_salt="" keyed blocks exactly as no salt; ((0, 0), ()) and ((0,), ()) named two KV layouts, so equal
    settings never shared blocks through a store (h7 F11)."""
    with pytest.raises(ValueError, match="cache_salt is empty"):
        PagedConfig(cache_salt="")
    twice = PagedConfig(kv_cache_dtype="int8", kv_full_precision_heads=((1, 0, 0), ()))
    assert twice.kv_full_precision_heads == ((0, 1), ())
    PagedConfig(sparse_prefill="block", sparse_keep_ratio=0.5, sparse_prefill_min_tokens=100)
