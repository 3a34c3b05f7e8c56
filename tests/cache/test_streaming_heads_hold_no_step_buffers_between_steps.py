"""A streaming-heads cache holds, between steps, only its storage: quantized blocks, staging rows and streaming slots.
The streaming heads' round trip of the blocks a step filled (read by that step's own queries) is dropped once the
step has read it (it was measured at 79% of a small pool's bytes when it was kept), and `kv_bytes_allocated` says so."""

import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model


def storage_bytes(cache) -> int:
    total = 0
    for layer in cache.block_layers:
        for store in layer.compressed:
            total += sum(t.nbytes for t in store.parts.values()) + store.staging.nbytes
            total += sum(t.nbytes for t in store.slot_parts.values())
    return total


def test_allocated_bytes_are_the_storage_after_each_step():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=40, kv_cache_dtype="int8",
                                       kv_streaming_heads=((1,), (0, 1)), num_sink_tokens=4, window_tokens=8,
                                       enable_prefix_caching=False, max_num_batched_tokens=24))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in ragged_prompts([37, 9], seed=4)]
    steps = 0
    while engine.has_unfinished:
        engine.step()
        steps += 1
        assert engine.stats()["kv_bytes_allocated"] == storage_bytes(engine.cache), steps
    assert steps > 3 and all(engine.pop_output(i).error is None for i in ids)
    assert engine.cache.kv_bytes_in_use(torch.float32) == 0
