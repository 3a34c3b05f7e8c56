"""The engine on a CUDA device: the paths a CPU run cannot prove (`scripts/gpu_check.sh` runs these).

The master test (greedy fp32 output identical to stock `generate`, with chunking, block sizes and prefix hits),
seeded sampling with forks, `max_retries`, sampled speculation (prompt lookup and a draft model), int8 / int4 KV
blocks, a JSON-schema constraint, and the server on 127.0.0.1 with seeds: each with the model on the GPU, where a
CPU generator, a CPU index tensor or a `.numpy()` on a CUDA tensor raises.
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
import torch

import hf_paged
from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, RequestStatus, SamplingParams
from tests.tiny_models import left_pad, ragged_prompts, stock_greedy, tiny_model

# HF_PAGED_TEST_DEVICE=cpu runs the same tests on the CPU (to check the tests themselves without a GPU)
CUDA = torch.device(os.environ.get("HF_PAGED_TEST_DEVICE", "cuda"))
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(CUDA.type == "cuda" and not torch.cuda.is_available(),
                                                  reason="needs a CUDA device")]
LENGTHS = [3, 17, 33, 50, 8, 70]


def run(engine: Engine, prompts, params) -> list:
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return [engine.pop_output(rid) for rid in ids]


def finished(outputs) -> list[list[int]]:
    for out in outputs:
        assert out.status is RequestStatus.FINISHED, out.error
    return [list(out.generated_tokens) for out in outputs]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2"])
def cuda_model(request):
    return tiny_model(request.param).to(CUDA)


@pytest.mark.parametrize("block_size, budget", [(1, 64), (16, 64), (64, 1024)])
def test_wrapped_generate_matches_stock_on_cuda(cuda_model, block_size, budget):
    ids, mask = left_pad(ragged_prompts(LENGTHS))
    ids, mask = ids.to(CUDA), mask.to(CUDA)
    stock = cuda_model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
    hf_paged.wrap(cuda_model, block_size=block_size, max_num_batched_tokens=budget)
    try:
        first = cuda_model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
        again = cuda_model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False)  # prefix hits
        engine = hf_paged.engine_of(cuda_model)
        engine.check_integrity()
        assert engine.stats()["prefix_hit_rate"] > 0
    finally:
        hf_paged.unwrap(cuda_model)
    assert torch.equal(first, stock) and torch.equal(again, stock)


def test_seeded_sampling_with_forks_is_reproducible_on_cuda():
    model = tiny_model("llama").to(CUDA)
    prompts = ragged_prompts([5, 30, 12])
    params = SamplingParams(max_new_tokens=16, do_sample=True, temperature=1.5, top_k=50, seed=7,
                            num_return_sequences=3)
    outs = [finished(run(Engine(model, PagedConfig(block_size=8)), prompts, params)) for _ in range(2)]
    assert outs[0] == outs[1]
    assert all(len(t) == 16 for t in outs[0])
    unseeded = finished(run(Engine(model, PagedConfig(block_size=8)), prompts, params.replace(seed=None)))
    assert all(len(t) == 16 for t in unseeded)


@pytest.mark.parametrize("drafter", ["prompt_lookup", "draft_model"])
def test_sampled_speculation_on_cuda(drafter):
    model = tiny_model("llama").to(CUDA)
    extra = {"draft_model": tiny_model("llama", seed=1).to(CUDA)} if drafter == "draft_model" else {}
    prompts = [[5, 6, 7, 8] * 6, ragged_prompts([20])[0]]
    params = SamplingParams(max_new_tokens=24, do_sample=True, seed=3, num_speculative_tokens=3, **extra)
    outs = [finished(run(Engine(model, PagedConfig(block_size=4, num_blocks=128)), prompts, params))
            for _ in range(2)]
    assert outs[0] == outs[1] and all(len(t) == 24 for t in outs[0])
    greedy = params.replace(do_sample=False, seed=None)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=128))
    assert finished(run(engine, prompts, greedy)) == finished(
        run(Engine(model, PagedConfig(block_size=4, num_blocks=128)), prompts, greedy.replace(
            num_speculative_tokens=0, draft_model=None)))


def _byte_model():
    from tests.batching.test_constrained_engine import model_and_tokenizer

    model, tok = model_and_tokenizer()
    return model.to(CUDA), tok


SCHEMA = {"type": "object", "properties": {"count": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "kind": {"enum": ["cat", "dog"]}},
          "required": ["count", "kind"], "additionalProperties": False}


def test_schema_constraint_and_max_retries_on_cuda():
    model, tok = _byte_model()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    prompt = tok("Tell me about 3 cats as JSON, please:")["input_ids"]
    seen = []

    def refuse_first(text) -> bool:
        seen.append(text)
        return len(seen) > 1

    params = SamplingParams(max_new_tokens=60, do_sample=True, seed=11, eos_token_id=tok.eos_token_id,
                            logits_processors=[proc], tokenizer=tok, max_retries=2, validator=refuse_first)
    (out,) = run(Engine(model, PagedConfig(block_size=8)), [prompt], params)
    assert out.status is RequestStatus.FINISHED and len(seen) == 2
    jsonschema.validate(json.loads(tok.decode(out.generated_tokens, skip_special_tokens=True)), SCHEMA)
    greedy = SamplingParams(max_new_tokens=60, eos_token_id=tok.eos_token_id, logits_processors=[proc])
    (out,) = run(Engine(model, PagedConfig(block_size=8)), [prompt], greedy)
    jsonschema.validate(json.loads(tok.decode(out.generated_tokens, skip_special_tokens=True)), SCHEMA)


@pytest.mark.parametrize("kv_dtype", ["int8", "int4"])
def test_quantized_blocks_on_cuda_follow_the_full_precision_run(kv_dtype):
    model = tiny_model("llama").to(CUDA)
    prompts = ragged_prompts(LENGTHS)
    greedy = SamplingParams(max_new_tokens=24)
    full = finished(run(Engine(model, PagedConfig(block_size=16)), prompts, greedy))
    engine = Engine(model, PagedConfig(block_size=16, kv_cache_dtype=kv_dtype))
    quant = finished(run(engine, prompts, greedy))
    again = finished(run(engine, prompts, greedy))  # prefix hits on quantized blocks
    assert quant == again
    first = [a[0] == b[0] for a, b in zip(full, quant)]
    assert sum(first) >= len(first) - 1, (kv_dtype, full, quant)  # the first token: one prefill, little drift
    sampled = finished(run(engine, prompts, SamplingParams(max_new_tokens=8, do_sample=True, seed=1)))
    assert all(len(t) == 8 for t in sampled)


def test_server_with_seeds_on_cuda():
    pytest.importorskip("fastapi")
    import httpx

    from hf_paged import default_model
    from tests.serving.conftest import make_server, wait_idle

    model, tok = default_model()
    server, engine = make_server((model.to(CUDA), tok))
    with server, httpx.Client(base_url=server.url, timeout=120) as client:
        body = {"model": "tiny-lm", "prompt": "def main():\n", "max_tokens": 24, "temperature": 0.9, "seed": 5,
                "n": 2}
        first, second = (client.post("/v1/completions", json=body) for _ in range(2))
        assert first.status_code == 200, first.text
        assert [c["text"] for c in first.json()["choices"]] == [c["text"] for c in second.json()["choices"]]
        schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}, "required": ["age"]}
        out = client.post("/v1/chat/completions", json={
            "model": "tiny-lm", "messages": [{"role": "user", "content": "an age"}], "max_tokens": 60, "seed": 3,
            "temperature": 0.7, "response_format": {"type": "json_schema",
                                                    "json_schema": {"name": "a", "schema": schema}}})
        assert out.status_code == 200, out.text
        choice = out.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        bad = client.post("/v1/completions", json={**body, "temperature": "hot"})
        assert 400 <= bad.status_code < 500 and "error" in bad.json()
        wait_idle(engine)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decode_graphs_replay_and_match_the_eager_engine_and_stock(family):
    """Decode steps replayed from CUDA graphs (on by default on CUDA): batches shrinking through several buckets
    (requests end at different lengths), padded rows, prefix hits on a second pass; the same greedy fp32 tokens as
    the engine without graphs and as stock generate."""
    model = tiny_model(family).to(CUDA)
    prompts = ragged_prompts(LENGTHS + [5, 9, 12, 40, 2, 26, 19])
    lengths = [3 + 3 * i for i in range(len(prompts))]  # 13 requests ending one after another: buckets 16 .. 1
    stock = [out[:n] for out, n in zip(stock_greedy(model, prompts, max(lengths), pad_token_id=0), lengths)]
    params = [SamplingParams(max_new_tokens=n) for n in lengths]
    eager = Engine(model, PagedConfig(block_size=8, cuda_graphs=False))
    graphs = Engine(model, PagedConfig(block_size=8))
    assert finished(run(eager, prompts, params)) == stock
    assert finished(run(graphs, prompts, params)) == stock
    assert finished(run(graphs, prompts, params)) == stock  # prefix hits, graphs already captured
    stats = graphs.stats()
    if CUDA.type == "cuda":
        assert stats["decode_graph_replays"] > 30 and stats["decode_graphs_captured"] >= 4
    assert eager.stats()["decode_graph_replays"] == 0
