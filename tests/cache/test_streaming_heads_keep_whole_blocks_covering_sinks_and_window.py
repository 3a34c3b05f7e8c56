"""Streaming heads with `num_sink_tokens` / `window_tokens` that are not multiples of the block size keep the whole
blocks that cover them (rounded up, never fewer tokens than asked): the slots held, and what the heads attend to,
equal a dense forward masked to ceil(sinks / bs) sink blocks and ceil(window / bs) window blocks."""

import torch
from transformers import AttentionInterface

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.compression.streaming_heads import held_table_indices
from tests.tiny_models import ragged_prompts, tiny_model

BS, SINKS, WINDOW = 4, 5, 7  # 5 sink tokens -> 2 sink blocks, 7 window tokens -> 2 window blocks
SINK_BLOCKS, WINDOW_BLOCKS = 2, 2
STREAMING = ((0, 1), (1,))


def _masked_eager(module, query, key, value, attention_mask, *, scaling=None, sliding_window=None, **kwargs):
    heads, kv_heads, n = query.shape[1], key.shape[1], query.shape[2]
    group = heads // kv_heads
    pos = torch.arange(n)
    causal = pos[None, :] <= pos[:, None]
    key_block, query_block = pos[None, :] // BS, pos[:, None] // BS
    local = causal & ((key_block < SINK_BLOCKS) | (key_block >= query_block - WINDOW_BLOCKS))
    mask = causal.expand(heads, n, n).clone()
    for h in STREAMING[module.layer_idx]:
        mask[h * group:(h + 1) * group] = local
    k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = (query @ k.transpose(-1, -2)) * scaling
    out = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    return out.transpose(1, 2).contiguous(), None


def test_partial_sink_and_window_tokens_round_up_to_whole_blocks():
    model = tiny_model("llama")
    prompt = ragged_prompts([38], seed=11)[0]
    engine = Engine(model, PagedConfig(block_size=BS, num_sink_tokens=SINKS, window_tokens=WINDOW,
                                       kv_streaming_heads=STREAMING, enable_prefix_caching=False,
                                       max_num_batched_tokens=9))
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=8, output_logits=True))
    held = []
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
        if rid in engine.kv.seqs:
            n = engine.kv.num_tokens(rid)
            held.append((len(engine.cache.slots.rows), len(held_table_indices(n, BS, SINK_BLOCKS, WINDOW_BLOCKS))))
    out = engine.pop_output(rid)
    assert out.error is None
    # once the prompt is past sinks + window, the store holds 2 sink + 2 window blocks (not 1 + 1)
    assert held[-1] == (4, 4) and all(slots == want for slots, want in held)

    AttentionInterface.register("streaming_round_up_ref", _masked_eager)
    saved = model.config._attn_implementation
    model.set_attn_implementation("streaming_round_up_ref")
    try:
        with torch.no_grad():
            ref = model(torch.tensor([prompt + out.generated_tokens])).logits[0]
    finally:
        model.set_attn_implementation(saved)
    ref = ref[len(prompt) - 1 : -1]
    got = torch.stack(out.logits).float()
    assert got.argmax(-1).tolist() == out.generated_tokens
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
