import pytest

from hf_paged import PagedConfig


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
