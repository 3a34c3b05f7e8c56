"""KV transfer with the model on a CUDA device (`scripts/gpu_check.sh` runs tests/gpu): blocks copied to the CPU
for saving and back onto the device for loading, the storage created on the device before the first forward of a
restarted engine, greedy fp32 tokens equal to stock `generate`; int8 blocks with their scales."""

from __future__ import annotations

import os

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import InProcessStore
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

# HF_PAGED_TEST_DEVICE=cpu runs the same tests on the CPU (to check the tests themselves without a GPU)
CUDA = torch.device(os.environ.get("HF_PAGED_TEST_DEVICE", "cuda"))
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(CUDA.type == "cuda" and not torch.cuda.is_available(),
                                                  reason="needs a CUDA device")]


def run(engine, prompts):
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=8)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return [engine.pop_output(i).generated_tokens for i in ids]


def stats(engine) -> dict:
    return {k.removeprefix("kv_transfer_"): v for k, v in engine.stats().items() if k.startswith("kv_transfer_")}


def test_blocks_move_between_engines_and_through_the_disk_on_the_device(tmp_path):
    model = tiny_model("llama").to(CUDA)
    system = ragged_prompts([45], seed=21)[0]
    prompts = [system + q for q in ragged_prompts([3, 11], seed=22)]
    expected = stock_greedy(model, prompts, 8)
    store = InProcessStore()
    assert run(Engine(model, PagedConfig(block_size=8), kv_store=store), prompts) == expected
    decode = Engine(model, PagedConfig(block_size=8), kv_store=store)
    assert run(decode, prompts) == expected and stats(decode)["loaded_blocks"] == 6

    disk = PagedConfig(block_size=8, num_blocks=16, kv_offload_dir=str(tmp_path), max_num_batched_tokens=64)
    writer = Engine(model, disk)
    run(writer, prompts[:1])
    assert writer.scheduler.kv_transfer.save_cached() > 0
    restarted = Engine(model, disk)
    assert run(restarted, prompts[:1]) == expected[:1] and stats(restarted)["loaded_blocks"] == 5

    config = PagedConfig(block_size=8, kv_cache_dtype="int8")
    alone = run(Engine(model, config), prompts)
    int8_store = InProcessStore()
    run(Engine(model, config, kv_store=int8_store), prompts)
    loaded = Engine(model, config, kv_store=int8_store)
    assert run(loaded, prompts) == alone and stats(loaded)["loaded_blocks"] == 6
