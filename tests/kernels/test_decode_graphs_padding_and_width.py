"""Decode graphs' host logic (`batching/decode_graphs.py`), on the CPU with `capture=False`: padded rows of a
smaller step attend to one key (their context reset to 1, not left at an earlier step's length), and a step whose
block tables are wider than the static buffers runs eagerly instead of failing the copy."""

from __future__ import annotations

from hf_paged import SamplingParams
from tests.kernels.test_decode_graphs import _engine, _model
from tests.tiny_models import ragged_prompts, stock_greedy


def test_padded_rows_of_a_smaller_step_attend_to_one_key():
    model = _model()
    engine = _engine(model)
    graphs = engine.runner.graphs
    prompts = ragged_prompts([3, 9, 14, 5, 7], seed=3, vocab=64)
    news = [4, 4, 8, 8, 8]  # five decodes (bucket 8), then three (bucket 4: one padded row)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, news)]
    seen = []
    run = graphs.run

    def recording(input_ids, positions, metadata):
        out = run(input_ids, positions, metadata)
        bucket = next(b for b in graphs.buckets if b >= len(input_ids))
        seen.append((len(input_ids), graphs._context[len(input_ids):bucket].tolist()))
        return out

    graphs.run = recording
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == [
        s[:n] for s, n in zip(stock_greedy(model, prompts, 8, pad_token_id=0), news)]
    rows = [n for n, _ in seen]
    assert 5 in rows and 3 in rows[rows.index(5):]  # a three-row step after five-row ones
    assert all(padding == [1] * len(padding) for _, padding in seen)  # never an earlier step's length


def test_block_tables_wider_than_the_static_buffers_run_eagerly():
    model = _model()
    engine = _engine(model)
    graphs = engine.runner.graphs
    graphs.width = 4  # as if built for 16-token sequences (block size 4); the static tables keep their 32 columns
    graphs._tables = graphs._tables[:, :4].contiguous()
    prompts = ragged_prompts([3, 20], seed=7, vocab=64)  # the second needs 6 blocks
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=5)) for p in prompts]
    outs = engine.run(ids)
    assert all(outs[i].error is None for i in ids)
    assert [outs[i].generated_tokens for i in ids] == stock_greedy(model, prompts, 5, pad_token_id=0)
