"""Decode steps on static buffers padded to a bucket (`batching/decode_graphs.py`), checked on the CPU.

A CPU cannot record a CUDA graph, so these run `DecodeGraphs(capture=False)`: the very forward a graph records,
on the same static buffers (padding rows with slot -1 and context 1, the static metadata the backend reads), each
step, through the Triton kernels in the interpreter. `tests/gpu` checks the captured graphs on a GPU.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.decode_graphs import BUCKETS, DecodeGraphs, buckets_up_to
from tests.kernels.paged_cases import DEVICE
from tests.tiny_models import ragged_prompts, stock_greedy


def _model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        eos_token_id=None, pad_token_id=0)).eval().to(DEVICE)


def _engine(model, **overrides) -> Engine:
    config = PagedConfig(block_size=4, attention_backend="triton", max_num_batched_tokens=32, max_num_seqs=8,
                         **overrides)
    engine = Engine(model, config)
    runner = engine.runner
    assert runner.lean is not None
    runner.graphs = DecodeGraphs(runner.lean, engine.cache.block_layers, device=runner.device, block_size=4,
                                 max_batch=8, max_blocks_per_seq=32, attention_backend="triton", capture=False)
    return engine


def test_buckets_cover_every_batch_up_to_the_largest():
    assert buckets_up_to(8) == (1, 2, 4, 8)
    assert buckets_up_to(100) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100)
    assert buckets_up_to(1) == (1,)
    assert list(BUCKETS) == sorted(BUCKETS)


def test_padded_decode_steps_match_stock_and_write_nothing_for_padding():
    model = _model()
    prompts = ragged_prompts([3, 9, 14, 5, 7], seed=3, vocab=64)  # 5 decodes: bucket 8, 3 padded rows
    expected = stock_greedy(model, prompts, 6, pad_token_id=0)
    engine = _engine(model)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = {i: engine.pop_output(i) for i in ids}
    assert [outs[i].generated_tokens for i in ids] == expected
    stats = engine.stats()
    assert stats["decode_graph_replays"] >= 4  # every decode step after the prompts
    # a second batch reuses the prompts' cached blocks: padding rows (slot -1) wrote into none of them
    again = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in prompts[:3]]  # 3 rows: bucket 4
    outs = engine.run(again)
    assert [outs[i].generated_tokens for i in again] == expected[:3]
    engine.check_integrity()


def test_steps_the_graphs_do_not_serve_run_eagerly():
    model = _model()
    engine = _engine(model, kv_cache_dtype="int8")  # compressed layers: never served
    prompts = ragged_prompts([6, 10], seed=5, vocab=64)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=4)) for p in prompts]
    engine.run(ids)
    assert engine.stats()["decode_graph_replays"] == 0
    plain = _engine(model)
    plain.add_request(prompts[0], SamplingParams(max_new_tokens=1))  # a prefill step only
    plain.run()
    assert plain.stats()["decode_graph_replays"] == 0


def test_more_requests_than_the_largest_bucket_run_eagerly():
    model = _model()
    engine = _engine(model)
    engine.runner.graphs.buckets = (1, 2)  # as if max_num_seqs were 2
    prompts = ragged_prompts([3, 4, 5], seed=6, vocab=64)
    expected = stock_greedy(model, prompts, 3, pad_token_id=0)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=3)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == expected
    assert engine.stats()["decode_graph_replays"] == 0


def test_graphs_are_off_the_gpu_or_when_turned_off_and_the_flag_is_checked():
    model = _model()
    on = Engine(model, PagedConfig(attention_backend="triton")).runner.graphs
    assert (on is None) == (DEVICE.type == "cpu")  # a CPU has nothing to capture
    assert Engine(model, PagedConfig(attention_backend="triton", cuda_graphs=False)).runner.graphs is None
    assert Engine(model, PagedConfig(attention_backend="torch")).runner.graphs is None
    with pytest.raises(ValueError, match="cuda_graphs must be None"):
        PagedConfig(cuda_graphs="yes")
