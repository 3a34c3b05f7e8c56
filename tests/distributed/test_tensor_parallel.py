"""transformers' tensor parallelism (`tp_plan="auto"`, DTensor) under the engine: 2 gloo ranks on CPU (torchrun).

Checked here for Llama and Qwen2 (the same runs pass for Mistral, Gemma and Phi-3; GPT-2 has no tensor-parallel plan
in transformers, so `from_pretrained(..., tp_plan="auto")` refuses it before hf_paged sees it).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.distributed import check_tensor_parallel, engine_config, local_kv_heads, tensor_parallel_size
from tests.distributed.cases import (
    BLOCK_SIZE,
    MAX_NEW_TOKENS,
    TP_FAMILIES,
    tokens,
    tp_prompts,
    tp_sampling_params,
)
from tests.distributed.launch import run_ranks
from tests.tiny_models import COMMON, stock_greedy, tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Tiny random models saved where `from_pretrained(dir, tp_plan="auto")` loads them offline."""
    root = tmp_path_factory.mktemp("tp_models")
    for family in TP_FAMILIES:
        tiny_model(family).save_pretrained(root / family)
    torch.manual_seed(0)  # 3 KV heads: 2 ranks cannot split them
    LlamaForCausalLM(LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                                 num_key_value_heads=3, max_position_embeddings=512, **COMMON)
                     ).save_pretrained(root / "llama_odd_kv_heads")
    return root


@pytest.fixture(scope="module")
def tp_ranks(model_dir, tmp_path_factory):
    """Both rank cases in one torchrun launch (`workers.tensor_parallel_both`): each rank's results by case."""
    return run_ranks("tensor_parallel_both", tmp_path_factory.mktemp("tp_out"), str(model_dir), timeout=400)


def _single_process(path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    stock = stock_greedy(model, tp_prompts(), MAX_NEW_TOKENS)
    hf_paged.wrap(model, block_size=BLOCK_SIZE)
    return {"stock": stock, "num_kv_heads": model.config.num_key_value_heads,
            "paged": tokens(model.generate_batch(tp_prompts(), max_new_tokens=MAX_NEW_TOKENS)),
            "sampled": tokens(model.generate_batch(tp_prompts(), sampling_params=tp_sampling_params()))}


def test_two_ranks_equal_one_process(tp_ranks, model_dir):
    ranks = [r["tensor_parallel"] for r in tp_ranks]
    assert ranks[0] == ranks[1]  # the ranks stayed in step: same pool, same schedule, same tokens
    # (unseeded sampling included, each rank's generator seeded apart: `Sampler.sync`)
    for family in TP_FAMILIES:
        got, single = ranks[0][family], _single_process(model_dir / family)
        assert got["tp_size"] == 2 and got["local_kv_heads"] == single["num_kv_heads"] // 2
        # greedy fp32 over 2 ranks == one process (paged and stock), default pool and a pool small enough to preempt
        assert got["greedy"] == single["paged"], family
        assert list(got["greedy"].values()) == single["stock"], family
        assert got["small_pool"] == single["paged"] and got["preemptions"] > 0, family
        assert got["small_pool_blocks"] == 16  # the budget counted the rank's own KV heads (all heads: 8 blocks)
        assert got["distributed"] == single["paged"]  # hf_paged.distributed.generate_batch: no sharding under TP
        assert got["sampled"] == single["sampled"], family
        # each rank's pages hold its own KV heads only: [num_blocks, block_size, local heads, head_dim]
        assert got["key_storage_shape"][1:3] == [BLOCK_SIZE, got["local_kv_heads"]]
        assert got["head_table"] == "InvalidConfigError" and got["snapkv"] == "InvalidConfigError"
        assert got["unseeded_speculative"] == "UnsupportedGenerationError"
    assert ranks[0]["odd_kv_heads"] == "UnsupportedModelError"


def test_stopping_verdicts_are_the_first_ranks(tp_ranks, model_dir):
    """A criterion that stops (or raises) on one rank only: before the first rank's verdicts were taken everywhere,
    the rank that went on ran a forward alone and gloo aborted it ("collective mismatch"). Calls back to back: the
    loop thread, woken by one call's end, took the next call's steps in 1 run of 4 before callers drove them
    (`EngineLoop._callers_drive`)."""
    ranks = [r["criteria"] for r in tp_ranks]
    assert ranks[0] == ranks[1]
    got, single = ranks[0], _single_process(model_dir / "llama")
    prompt, generated = tp_prompts()[0], single["stock"][0]
    stopped, full = [prompt + generated[:3]], [prompt + generated]
    assert got["stops_on_rank_0"] == stopped  # the first rank's verdict
    assert got["stops_on_rank_1"] == full  # the other rank's verdict is not taken
    assert got["raises_on_rank_0"] == "StoppingCriterionError"
    assert got["raises_on_rank_1"] == full
    assert got["after"] == single["paged"]  # still in step
    assert got["generate_async"] == "UnsupportedGenerationError"


class _FakeTensorParallel(torch.nn.Module):
    """What `tensor_parallel` reads of a tp_plan model, without processes: `_tp_size`, `tp_plan`, the config."""

    def __init__(self, num_kv_heads: int, tp_size: int, **distributed):
        super().__init__()
        self.inner = tiny_model("llama")
        self.config = self.inner.config
        self.config.num_key_value_heads = num_kv_heads
        self.config.distributed_config = type("DistributedConfig", (), {"tp_size": tp_size, **distributed})()
        self._tp_size = tp_size
        self.tp_plan = {"model.layers.*.self_attn.k_proj": "colwise"}


def test_checks_without_processes():
    assert tensor_parallel_size(tiny_model("llama")) == 1
    assert local_kv_heads(_FakeTensorParallel(2, 2)) == 1
    with pytest.raises(hf_paged.errors.UnsupportedModelError, match="does not divide"):
        local_kv_heads(_FakeTensorParallel(3, 2))
    with pytest.raises(hf_paged.errors.UnsupportedModelError, match="pp_size=2"):
        check_tensor_parallel(_FakeTensorParallel(2, 2, pp_size=2), hf_paged.PagedConfig())
    with pytest.raises(hf_paged.errors.InvalidConfigError, match="kv_full_precision_heads"):
        check_tensor_parallel(_FakeTensorParallel(2, 2), hf_paged.PagedConfig(kv_full_precision_heads=((0,), ())))
    with pytest.raises(hf_paged.errors.InvalidConfigError, match="kv_streaming_heads"):
        check_tensor_parallel(_FakeTensorParallel(2, 2),
                              hf_paged.PagedConfig(kv_streaming_heads=((0,), ()), enable_prefix_caching=False))
    pyramid = hf_paged.PagedConfig(kv_pruning="pyramidkv", kv_keep_ratio=0.5)  # (alone, refused as idle)
    with pytest.raises(hf_paged.errors.InvalidConfigError, match="pyramidkv"):
        check_tensor_parallel(_FakeTensorParallel(2, 2), pyramid)
    check_tensor_parallel(_FakeTensorParallel(2, 2), hf_paged.PagedConfig(kv_pruning="streaming"))
    # settings that already fix the pool size need no agreement between ranks (no collective)
    config = hf_paged.PagedConfig(num_blocks=7)
    assert engine_config(_FakeTensorParallel(2, 2), config) is config
