"""Token pruning in the engine: generation after pruning equals the model attending to the kept tokens only
(checked against a plain forward with an explicit mask), memory is freed, and shared blocks survive."""

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model

BS = 4


def run_recording(model, prompts, max_new, **config):
    """Run to completion; record per request every eviction as (logical length when it ran, evicted positions)."""
    engine = Engine(model, PagedConfig(block_size=BS, **config))
    events: dict[str, list] = {}
    starts: dict[str, list[int]] = {}
    evict = engine.kv.drop_blocks

    def recording(seq_id, indices):
        table = engine.kv.block_ids(seq_id)
        logical = starts.setdefault(seq_id, [])
        while len(logical) < len(table):
            logical.append(logical[-1] + BS if logical else 0)
        length = engine.kv.num_tokens(seq_id) + engine.kv.num_dropped_tokens(seq_id)
        dropped = {p for i in indices for p in range(logical[i], logical[i] + BS)}
        events.setdefault(seq_id, []).append((length, dropped))
        starts[seq_id] = [s for i, s in enumerate(logical) if i not in set(indices)]
        evict(seq_id, indices)

    engine.kv.drop_blocks = recording
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    return engine, outs, [events.get(i, []) for i in ids]


def masked_greedy(model, prompt, generated, events):
    """Next-token argmax of a plain forward where a query at position q does not see what was evicted before q."""
    tokens = prompt + generated
    n = len(tokens)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    for length, dropped in events:
        for p in dropped:
            allowed[length:, p] = False
    mask = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))  # additive: 4D bool masks are not honoured
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), attention_mask=mask[None, None]).logits[0]
    return logits[len(prompt) - 1 : n - 1].argmax(-1).tolist()


@pytest.fixture(scope="module")
def model():
    m = tiny_model("llama")
    m.config._attn_implementation = "eager"  # the reference forward takes an explicit 4D mask
    return m


@pytest.mark.parametrize("policy, dtype", [("snapkv", "auto"), ("streaming", "auto"), ("snapkv", "int8")])
def test_generation_equals_attention_over_the_kept_tokens(model, policy, dtype):
    prompts = ragged_prompts([70, 45, 9], seed=6)
    engine, outs, events = run_recording(
        model, prompts, 30, kv_pruning=policy, kv_keep_ratio=0.4, num_sink_tokens=4, window_tokens=12,
        max_num_batched_tokens=32, kv_cache_dtype=dtype,
    )
    assert events[0] and events[1]
    if policy == "snapkv":
        assert all(len(e) == 1 for e in events[:2])  # once, when the prompt ends
        assert not events[2]  # the 9-token prompt fits its budget (sinks + window)
    else:
        assert all(len(e) > 1 for e in events)  # again and again as the generation grows
    if dtype == "auto":
        for prompt, out, ev in zip(prompts, outs, events):
            assert out.generated_tokens == masked_greedy(model, prompt, out.generated_tokens, ev)
    assert engine.stats()["kv_blocks_evicted"] == sum(len(d) for ev in events for _, d in ev) // BS
    assert engine.cache.pool.num_used_blocks == 0


def test_streaming_bounds_the_blocks_of_a_long_generation(model):
    engine, outs, _ = run_recording(model, ragged_prompts([20], seed=1), 120, kv_pruning="streaming",
                                    num_sink_tokens=4, window_tokens=12, kv_keep_ratio=1.0)
    assert len(outs[0].generated_tokens) == 120
    # budget: max(20 tokens, 4 + 12) = 5 blocks, plus one block of slack before a block is dropped
    assert engine.stats()["peak_blocks_used"] <= 7


def test_prefix_shared_blocks_are_never_evicted(model):
    base = ragged_prompts([40], seed=2)[0]
    engine = Engine(model, PagedConfig(block_size=BS, kv_pruning="snapkv", kv_keep_ratio=0.3, num_sink_tokens=4,
                                       window_tokens=8))
    first = engine.add_request(base + [5, 6], SamplingParams(max_new_tokens=4))
    engine.run([first])
    # The first request evicted most of its prompt: only its sink blocks were a prefix worth caching.
    cached_after_first = engine.cache.pool.num_cached_blocks
    assert cached_after_first == 1
    second = engine.add_request(base + [7, 8, 9], SamplingParams(max_new_tokens=4))
    out = engine.run([second])[second]
    assert out.num_cached_tokens == 4
    engine.check_integrity()


def test_eviction_on_the_stock_cache_path_is_refused(model):
    from hf_paged import PagedCache

    cache = PagedCache(model.config, PagedConfig(block_size=BS, num_blocks=32, kv_pruning="snapkv", kv_keep_ratio=0.5))
    with pytest.raises(ValueError, match="kv_pruning='snapkv' needs the hf_paged attention"):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, cache=cache)


def test_pyramidkv_keeps_the_union_and_hides_per_layer(model):
    prompts = ragged_prompts([90], seed=8)
    engine = Engine(model, PagedConfig(block_size=BS, kv_pruning="pyramidkv", kv_keep_ratio=0.3, num_sink_tokens=4,
                                       window_tokens=8, max_num_batched_tokens=32))
    rid = engine.add_request(prompts[0], SamplingParams(max_new_tokens=6))
    while engine.requests[rid].num_computed_tokens < 90:
        engine.step()
    hidden = engine.kv.hidden_blocks(rid)
    kept = len(engine.kv.block_ids(rid))
    # budget 27 tokens -> 7 blocks; layer 0 picks 10 (1.5x), layer 1 picks 4 (0.5x, floored at 3 sink+window)
    assert kept >= 10 and len(hidden[0]) == kept - 10 and len(hidden[1]) == kept - 4
    out = engine.run([rid])[rid]
    assert len(out.generated_tokens) == 6 and out.error is None
    engine.check_integrity()


# -- streaming heads (DuoAttention): sinks + window per head, in a small store of their own ---------------------
STREAMING = ((1,), (0, 1))  # layer 0: KV head 1; layer 1: both KV heads


def run_streaming(model, prompts, max_new, **config):
    config = {"block_size": BS, "kv_streaming_heads": STREAMING, "kv_cache_dtype": "int8", "num_sink_tokens": 4,
              "window_tokens": 8, "enable_prefix_caching": False} | config
    n = config.pop("num_return_sequences", 1)
    engine = Engine(model, PagedConfig(**config))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new, num_return_sequences=n)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    ids += [f"{i}__child#{c}" for i in ids for c in range(n - 1)]
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs)
    return engine, [o.generated_tokens for o in outs]


@pytest.fixture(scope="module")
def streaming_alone(model):
    prompts = ragged_prompts([41, 3, 29, 17], seed=5)
    return prompts, [run_streaming(model, [p], 12, max_num_batched_tokens=256)[1][0] for p in prompts]


def test_streaming_heads_int8_ragged_chunked_batch_matches_one_at_a_time(model, streaming_alone):
    prompts, alone = streaming_alone
    engine, got = run_streaming(model, prompts, 12, max_num_batched_tokens=16)
    assert got == alone
    assert engine.cache.kv_bytes_in_use(torch.float32) == 0  # finished: no live block, no live slot
    assert engine.cache.slots.capacity <= 4 * (1 + 2 + 2)  # 4 sequences at most hold 1 sink + 2 window blocks each


def test_streaming_heads_survive_recompute_preemption(model, streaming_alone):
    prompts, alone = streaming_alone
    engine, got = run_streaming(model, prompts, 12, max_num_batched_tokens=16, num_blocks=20)
    assert engine.stats()["preemptions"] > 0
    assert got == alone


def test_streaming_heads_forks_share_their_slots(model, streaming_alone):
    """Forks share full blocks (and so their slots) and copy the partial one; each gets the tokens run alone."""
    prompts, alone = streaming_alone
    _, got = run_streaming(model, prompts[:1], 12, num_return_sequences=3)
    assert got == [alone[0]] * 3
