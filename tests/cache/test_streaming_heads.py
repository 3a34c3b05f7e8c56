"""Streaming heads (DuoAttention): attention equals a dense forward with those heads masked to sinks + window
blocks, their store holds only sinks + window slots, and unsupported settings are refused."""

import itertools

import pytest
import torch
from transformers import AttentionInterface

from hf_paged import Engine, PagedCache, PagedConfig, SamplingParams
from hf_paged.cache.compression.calibration import calibrate_streaming_heads
from hf_paged.cache.compression.streaming_heads import SlotMap, held_table_indices
from tests.tiny_models import ragged_prompts, tiny_model

BS, SINKS, WINDOW = 4, 4, 8  # 1 sink block, 2 window blocks
STREAMING = ((1,), (0, 1))  # layer 0: KV head 1; layer 1: both KV heads
_REF: dict = {}


def _masked_eager(module, query, key, value, attention_mask, *, scaling=None, sliding_window=None, **kwargs):
    """Eager attention of one unpadded sequence; the KV heads in `_REF["heads"][layer]` see sinks + window only."""
    heads, kv_heads, n = query.shape[1], key.shape[1], query.shape[2]
    group = heads // kv_heads
    pos = torch.arange(n)
    causal = pos[None, :] <= pos[:, None]
    if sliding_window is not None:
        causal &= pos[None, :] > pos[:, None] - sliding_window
    key_block, query_block = pos[None, :] // BS, pos[:, None] // BS
    local = causal & ((key_block < SINKS // BS) | (key_block >= query_block - WINDOW // BS))  # sink | window blocks
    mask = causal.expand(heads, n, n).clone()
    for h in _REF["heads"][module.layer_idx]:
        mask[h * group:(h + 1) * group] = local
    k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = (query @ k.transpose(-1, -2)) * scaling
    out = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module")
def model():
    AttentionInterface.register("streaming_ref", _masked_eager)
    return tiny_model("llama")


@pytest.fixture(scope="module")
def mistral():  # sliding window 24: the streaming heads' sinks also fall out of it
    AttentionInterface.register("streaming_ref", _masked_eager)
    return tiny_model("mistral")


def reference_logits(model, tokens, streaming):
    _REF["heads"] = streaming
    saved = model.config._attn_implementation
    model.set_attn_implementation("streaming_ref")
    try:
        with torch.no_grad():
            return model(torch.tensor([tokens])).logits[0]
    finally:
        model.set_attn_implementation(saved)


def run(model, prompts, max_new, **config):
    cfg = PagedConfig(block_size=BS, num_sink_tokens=SINKS, window_tokens=WINDOW, enable_prefix_caching=False,
                      **config)
    engine = Engine(model, cfg)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new, output_logits=True)) for p in prompts]
    in_use = []
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
        in_use.append(engine.cache.kv_bytes_in_use(torch.float32))
        assert engine.stats()["kv_bytes_in_use"] == in_use[-1]  # the model is fp32: stats cost it the same
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs)
    return engine, outs, in_use


@pytest.mark.parametrize("family, budget", [("model", 7), ("model", 64), ("mistral", 7)])  # 7: chunked prefill
def test_attention_equals_a_dense_masked_reference(request, family, budget):
    model = request.getfixturevalue(family)
    prompts = ragged_prompts([37, 5, 22], seed=4)
    _, outs, _ = run(model, prompts, 9, kv_streaming_heads=STREAMING, max_num_batched_tokens=budget)
    for prompt, out in zip(prompts, outs):
        tokens = prompt + out.generated_tokens
        ref = reference_logits(model, tokens, STREAMING)[len(prompt) - 1 : len(tokens) - 1]
        got = torch.stack(out.logits).float()
        assert got.argmax(-1).tolist() == out.generated_tokens == ref.argmax(-1).tolist()
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    plain = reference_logits(model, prompts[0] + outs[0].generated_tokens, ((), ()))
    assert not torch.allclose(plain[len(prompts[0]) - 1 : -1], torch.stack(outs[0].logits), atol=1e-3)  # masks matter


def test_streaming_slots_are_released_as_sequences_grow(model):
    prompt = ragged_prompts([6], seed=6)[0]
    engine, _, in_use = run(model, [prompt], 50, kv_streaming_heads=((1,), (0, 1)), kv_cache_dtype="int4")
    cache = engine.cache
    block_bytes, slot_bytes = cache.compressed_bytes_per_block(torch.float32), cache.streaming_bytes_per_slot(
        torch.float32)
    # int4, block 4, head_dim 8, h heads: keys 16h data + 16h fp16 scales + 8h zeros (per channel); values 16h data
    # + 8 + 4 (per token). Blocks keep layer 0's KV head 0; slots hold layer 0's head 1 and both heads of layer 1.
    assert block_bytes == 40 + 28
    assert slot_bytes == (40 + 28) + (80 + 44)
    # After the last step: 56 - 1 tokens stored = 13 full blocks + 3 tokens: slots hold 1 sink + 2 window blocks.
    assert in_use[-2] == 14 * block_bytes + 3 * slot_bytes
    # Once past sinks + window, streaming bytes stop growing: in-use grows by block_bytes per block only.
    assert in_use[-1] == 0  # the request finished: its blocks and slots are free
    growth = [b - a for a, b in itertools.pairwise(in_use[:-1]) if b != a]
    # (a block costs block_bytes when allocated, slot_bytes when it fills inside sinks + window; from the 4th full
    # block on, each filling block takes the slot another block leaves)
    assert in_use[0] == 2 * block_bytes + slot_bytes  # the 6-token prompt: one full block, one partial
    assert growth == [slot_bytes, block_bytes, slot_bytes] + [block_bytes] * (len(growth) - 3)
    assert len(cache.slots.rows) == 3 and cache.slots.capacity <= 4 * (1 + 2 + 2)
    assert engine.cache.layers[1].compressed[0].slot_parts["data"].shape[0] == cache.slots.capacity


def test_slot_map_reuses_released_slots_only_from_the_next_plan():
    slots = SlotMap(2)
    slots.plan({10, 11}, [10, 11], {10, 11})
    assert slots.rows == {10: 0, 11: 1}
    slots.plan({10, 12}, [12], {10, 11, 12})  # 11 left the window: 12 must not take its slot in the same plan
    assert slots.rows[12] not in (0, 1) and 11 not in slots.rows and slots.capacity == 6
    slots.plan({10, 12, 13}, [13], {10, 11, 12, 13})
    assert slots.rows[13] == 1  # 11's old slot, free since the previous plan
    slots.plan({14}, [14], {14})  # 10, 12 and 13 were freed (their sequence ended): their slots serve at once
    assert slots.rows == {14: 1} and slots.capacity == 6


def test_held_blocks_are_sinks_plus_window():
    assert held_table_indices(30, 4, 1, 2) == [0, 5, 6]  # 7 full blocks + 2 tokens: blocks 5, 6 + partial 7
    assert held_table_indices(32, 4, 1, 2) == [0, 6, 7]
    assert held_table_indices(5, 4, 1, 2) == [0]


@pytest.mark.parametrize("overrides, message", [
    ({"kv_streaming_heads": ((0,),)}, "enable_prefix_caching"),
    ({"kv_streaming_heads": ((0,),), "enable_prefix_caching": False, "kv_pruning": "snapkv"}, "kv_pruning"),
    ({"kv_streaming_heads": ((0,),), "enable_prefix_caching": False, "preemption_mode": "swap"}, "preemption_mode"),
    ({"kv_streaming_heads": ((0,),), "enable_prefix_caching": False, "kv_full_precision_heads": ((0,),)},
     "disjoint"),
    ({"kv_streaming_heads": ((-1,),), "enable_prefix_caching": False}, "ints >= 0"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        PagedConfig(**overrides)


def test_heads_out_of_range_and_stock_path_are_refused(model):
    with pytest.raises(ValueError, match=r"kv_streaming_heads=\(\(2,\),\) does not fit"):
        PagedCache(model.config, PagedConfig(kv_streaming_heads=((2,),), enable_prefix_caching=False, num_blocks=8))
    cache = PagedCache(model.config, PagedConfig(kv_streaming_heads=((1,),), enable_prefix_caching=False,
                                                 num_blocks=8))
    with pytest.raises(ValueError, match="stock cache= path"):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, cache=cache)


def test_calibration_ranks_pairs_by_the_kl_of_streaming_alone(model):
    samples = ragged_prompts([40, 33], seed=7)
    before = model.config._attn_implementation
    heads = calibrate_streaming_heads(model, samples, num_streaming=3, num_sink_tokens=SINKS, window=WINDOW,
                                      block_size=BS, num_positions=10)
    assert model.config._attn_implementation == before
    expected = torch.zeros(2, 2)
    for sample in samples:
        full = torch.log_softmax(reference_logits(model, sample, ((), ()))[-10:], -1)
        for layer in range(2):
            for head in range(2):
                streaming = tuple((head,) if i == layer else () for i in range(2))
                logp = torch.log_softmax(reference_logits(model, sample, streaming)[-10:], -1)
                expected[layer, head] += (full.exp() * (full - logp)).sum(-1).mean() / len(samples)
    torch.testing.assert_close(heads.kl, expected, atol=1e-6, rtol=1e-4)
    assert (heads.kl > 0).all()
    worst = divmod(int(heads.kl.flatten().argmax()), 2)
    assert sum(len(h) for h in heads.streaming_heads) == 3 and worst[1] not in heads.streaming_heads[worst[0]]
    with pytest.raises(ValueError, match="num_streaming"):
        calibrate_streaming_heads(model, samples, num_streaming=5)
