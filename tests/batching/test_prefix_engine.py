"""Prefix caching in the engine: parity with caching off and with stock generate, sharing, eviction, weights."""

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

MAX_NEW = 12


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def run(engine, prompts, max_new=MAX_NEW, **kw):
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new, **kw)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return [engine.pop_output(i).generated_tokens for i in ids]


def shared_prompts():
    system = ragged_prompts([37], seed=21)[0]  # 37 tokens: with block_size 8 the shared part ends mid-block
    return [system + q for q in ragged_prompts([1, 4, 9, 13], seed=22)]


def test_parity_with_hits_that_end_mid_block(model):
    prompts = shared_prompts()
    expected = stock_greedy(model, prompts, MAX_NEW)
    off = Engine(model, PagedConfig(block_size=8, enable_prefix_caching=False))
    on = Engine(model, PagedConfig(block_size=8))
    assert run(off, prompts) == expected
    assert run(on, prompts[:1]) == expected[:1]  # warms the cache
    assert run(on, prompts[1:]) == expected[1:]
    stats = on.stats()
    # all 37 shared tokens, for 3 requests: 4 full blocks, and 5 tokens copied from the first prompt's fifth block
    assert stats["prompt_tokens_cached"] == 3 * 37
    assert stats["blocks_cached"] > 0


def test_requests_arriving_together_compute_the_shared_prefix_once(model):
    prompts = shared_prompts()
    engine = Engine(model, PagedConfig(block_size=8, max_num_batched_tokens=256))
    assert run(engine, prompts) == stock_greedy(model, prompts, MAX_NEW)
    stats = engine.stats()
    assert stats["prompt_tokens_cached"] == 3 * 32
    assert stats["prefix_hit_rate"] == pytest.approx(96 / sum(map(len, prompts)))


def test_evicted_blocks_are_recomputed_correctly(model):
    prompts = [p + q for p in ragged_prompts([40, 40, 40], seed=31) for q in ragged_prompts([5], seed=32)]
    expected = stock_greedy(model, prompts, MAX_NEW)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=10))  # room for about one request at a time
    first = run(engine, prompts)
    assert first == expected
    again = run(engine, prompts[::-1])  # the last prompt's blocks are cached, the others were evicted
    assert again == expected[::-1]
    assert engine.stats()["prefix_evictions"] > 0
    assert engine.stats()["prompt_tokens_cached"] > 0


def test_forks_share_prompt_blocks_and_copy_on_write(model):
    prompt = ragged_prompts([21], seed=41)[0]  # 21 tokens, block_size 8: the last prompt block is partial
    engine = Engine(model, PagedConfig(block_size=8))
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=MAX_NEW, num_return_sequences=3))
    engine.step()  # prefill + first token: the forks now share all of the parent's blocks
    ids = (rid, f"{rid}__child#0", f"{rid}__child#1")
    assert len({tuple(engine.kv.block_ids(r)) for r in ids}) == 1
    engine.step()  # each writes its first token into the partial block: copied on write
    tables = [engine.kv.block_ids(r) for r in ids]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]  # full prompt blocks still shared
    assert len({t[2] for t in tables}) == 3
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(r).generated_tokens for r in (rid, f"{rid}__child#0", f"{rid}__child#1")]
    assert outs[0] == outs[1] == outs[2] == stock_greedy(model, [prompt], MAX_NEW)[0]
    assert engine.cache.pool.num_used_blocks == 0


def test_multi_turn_reuses_previous_answer(model):
    engine = Engine(model, PagedConfig(block_size=8))
    prompt = ragged_prompts([30], seed=51)[0]
    answer = run(engine, [prompt], max_new=20)[0]
    follow_up = prompt + answer + ragged_prompts([6], seed=52)[0]
    before = engine.stats()["prompt_tokens_cached"]
    assert run(engine, [follow_up]) == stock_greedy(model, [follow_up], MAX_NEW)
    cached = engine.stats()["prompt_tokens_cached"] - before
    assert cached >= (len(prompt) + len(answer) - 1) // 8 * 8  # the whole previous turn, generated part too


def test_weight_change_invalidates_the_cache():
    model = tiny_model("llama", seed=3)
    prompts = shared_prompts()
    engine = Engine(model, PagedConfig(block_size=8))
    run(engine, prompts[:1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(torch.tensor([prompts[0]]), labels=torch.tensor([prompts[0]])).loss
    loss.backward()
    optimizer.step()
    before = engine.stats()["prompt_tokens_cached"]
    assert run(engine, prompts[1:2]) == stock_greedy(model, prompts[1:2], MAX_NEW)
    assert engine.stats()["prompt_tokens_cached"] == before  # no stale hit
    engine.check_integrity()
    assert engine.reset_prefix_cache() >= 0


@pytest.mark.parametrize("change", ["fused AdamW", ".data edit", "buffer"])
def test_changes_that_move_no_version_counter_invalidate_the_cache(change):
    """A fused optimizer (Trainer's default `adamw_torch_fused`) and an edit through `.data` (EMA, hand-written
    loops) write the weights without moving their version counters: the prefix cache served keys of the old
    weights (wrong tokens, no warning). RoPE's inverse frequencies are a buffer, checked the same way."""
    model = tiny_model("llama", seed=3)
    prompts = shared_prompts()
    engine = Engine(model, PagedConfig(block_size=8))
    run(engine, prompts[:1])
    if change == "fused AdamW":
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
        model(torch.tensor([prompts[0]]), labels=torch.tensor([prompts[0]])).loss.backward()
        versions = [p._version for p in model.parameters()]
        optimizer.step()
        assert versions == [p._version for p in model.parameters()]  # (what made it invisible before)
    elif change == ".data edit":
        for p in model.parameters():
            p.data.mul_(0.5)
    else:
        model.model.rotary_emb.inv_freq.mul_(0.5)
    before = engine.stats()["prompt_tokens_cached"]
    assert run(engine, prompts[1:2]) == stock_greedy(model, prompts[1:2], MAX_NEW)
    assert engine.stats()["prompt_tokens_cached"] == before  # no stale hit


class _ToyAdapter(torch.nn.Module):
    """A linear layer with an adapter that can be turned off, as PEFT's tuner layers: `disable_adapters`."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base = base
        self.delta = torch.nn.Linear(base.in_features, base.out_features, bias=False)
        torch.nn.init.normal_(self.delta.weight, std=1.0)
        self.off = False
        self.active_adapters = ["default"]

    @property
    def disable_adapters(self) -> bool:  # (a property, as PEFT's)
        return self.off

    def forward(self, x):
        return self.base(x) if self.off else self.base(x) + self.delta(x)


@pytest.mark.parametrize("change", ["hook removed", "hook added", "adapter off"])
def test_module_behaviour_changes_invalidate_the_cache(change):
    """A forward hook removed or added, or a PEFT adapter turned off (`with peft_model.disable_adapter():`),
    changes what the model computes without touching a weight: the prefix cache served keys of the old
    behaviour (wrong tokens, no warning)."""
    model = tiny_model("llama", seed=3)
    layer = model.model.layers[0]
    steer = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(5)) * 2

    def hook(module, args, out):
        return (out[0] + steer, *out[1:]) if isinstance(out, tuple) else out + steer

    handle = layer.register_forward_hook(hook) if change == "hook removed" else None
    if change == "adapter off":
        layer.mlp.down_proj = _ToyAdapter(layer.mlp.down_proj)
    prompts = shared_prompts()
    engine = Engine(model, PagedConfig(block_size=8))
    run(engine, prompts[:1])
    if change == "hook removed":
        handle.remove()
    elif change == "hook added":
        layer.register_forward_hook(hook)
    else:
        layer.mlp.down_proj.off = True
    before = engine.stats()["prompt_tokens_cached"]
    assert run(engine, prompts[1:2]) == stock_greedy(model, prompts[1:2], MAX_NEW)
    assert engine.stats()["prompt_tokens_cached"] == before  # no stale hit
