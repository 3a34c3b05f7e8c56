"""`hf-paged serve --kv-offload-dir`: the flags reach `PagedConfig`; refused with --replicas; the cache written at
shutdown."""

from __future__ import annotations

import argparse

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.errors import CliError
from hf_paged.serving.server import _save_kv_cache, add_serve_arguments, checked_paged_config
from tests.tiny_models import ragged_prompts, tiny_model


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flags_reach_the_config(tmp_path):
    config = checked_paged_config(parse("--kv-offload-dir", str(tmp_path), "--kv-offload-bytes", "4096"))
    assert config.kv_offload_dir == str(tmp_path) and config.kv_offload_bytes == 4096
    assert checked_paged_config(parse()).kv_offload_dir is None
    with pytest.raises(CliError, match="kv_offload_bytes"):
        checked_paged_config(parse("--kv-offload-dir", str(tmp_path), "--kv-offload-bytes", "0"))
    with pytest.raises(CliError, match="--replicas"):
        checked_paged_config(parse("--kv-offload-dir", str(tmp_path), "--replicas", "2"))


def test_the_cache_is_written_at_shutdown(tmp_path):
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=8, kv_offload_dir=str(tmp_path)))
    engine.run([engine.add_request(ragged_prompts([40], seed=3)[0], SamplingParams(max_new_tokens=4))])
    _save_kv_cache(engine)
    assert len(list(tmp_path.glob("*.kvb"))) == len(engine.kv.prefix_cache.cached_nodes()) == 5  # full blocks; tails stay local
    _save_kv_cache(Engine(model, PagedConfig(block_size=8)))  # no disk tier: nothing to do
