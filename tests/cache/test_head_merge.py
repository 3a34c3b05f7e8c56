"""Head merging (CHAI): a merged layer attends as a dense eager reference where each head uses its representative's
probabilities on its own values; clusters of one head give stock's tokens; keys are stored for representatives'
KV heads only (fewer bytes in the pool); calibration and bad settings."""

import pytest
import torch
from transformers import AttentionInterface

from hf_paged import Engine, PagedCache, PagedConfig, SamplingParams
from hf_paged.cache.head_merge import HeadMergePlan, LayerMerge
from hf_paged.cache.head_merge_attention import MergedIndices, run_merged_plan
from hf_paged.cache.head_merge_calibrate import calibrate_head_merge, choose_layer_merge, plan_from_distances
from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan
from hf_paged.cache.merged_layer import MergedLayer
from hf_paged.errors import InvalidConfigError, UnsupportedGenerationError
from tests.cache.engine_parity import check_engine_parity
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

# tiny llama: 4 query heads over 2 KV heads (heads 0, 1 -> KV 0; heads 2, 3 -> KV 1)
MERGE = ((0, 0, 0, 0), (0, 1, 0, 1))  # both layers keep KV head 0's keys only
_REF: dict = {}


def _merged_eager(module, query, key, value, attention_mask, *, scaling=None, sliding_window=None, **kwargs):
    """Eager attention of one unpadded sequence where head h uses head reps[h]'s probabilities on its own values."""
    reps = torch.tensor(_REF["merge"][module.layer_idx])
    heads, kv_heads, n = query.shape[1], key.shape[1], query.shape[2]
    group = heads // kv_heads
    k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = (query @ k.transpose(-1, -2)) * scaling
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)[:, reps]
    return (probs @ v).transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module")
def model():
    AttentionInterface.register("head_merge_ref", _merged_eager)
    return tiny_model("llama")


def run(model, prompts, max_new, **config):
    engine = Engine(model, PagedConfig(block_size=4, **config))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new, output_logits=True)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs)
    return engine, outs


@pytest.mark.parametrize("budget", [7, 64])  # 7: chunked prefill
def test_merged_attention_equals_the_eager_reference(model, budget):
    prompts = ragged_prompts([37, 5, 22], seed=4)
    engine, outs = run(model, prompts, 9, head_merge=MERGE, max_num_batched_tokens=budget)
    assert [type(layer) for layer in engine.cache.block_layers] == [MergedLayer, MergedLayer]
    _REF["merge"] = MERGE
    saved = model.config._attn_implementation
    model.set_attn_implementation("head_merge_ref")
    try:
        for prompt, out in zip(prompts, outs):
            tokens = prompt + out.generated_tokens
            with torch.no_grad():
                ref = model(torch.tensor([tokens])).logits[0, len(prompt) - 1 : len(tokens) - 1]
            got = torch.stack(out.logits).float()
            assert got.argmax(-1).tolist() == out.generated_tokens == ref.argmax(-1).tolist()
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
        _REF["merge"] = ((0, 1, 2, 3),) * 2  # the reference itself: unmerged it differs, so the merge mattered
        with torch.no_grad():
            plain = model(torch.tensor([prompts[0] + outs[0].generated_tokens])).logits[0, len(prompts[0]) - 1 : -1]
        assert not torch.allclose(plain, torch.stack(outs[0].logits), atol=1e-4)
    finally:
        model.set_attn_implementation(saved)


def test_clusters_of_one_head_give_stock_tokens(model, monkeypatch):
    """The exact path: every layer on the merged attention (forced, though nothing merges), tokens as stock's."""
    monkeypatch.setattr(LayerMerge, "is_identity", property(lambda self: False))
    prompts = ragged_prompts([5, 33, 19, 2], seed=3)
    identity = HeadMergePlan.identity(2, 4, 2).representatives
    engine, outs = run(model, prompts, 12, head_merge=identity, max_num_batched_tokens=16)
    assert all(isinstance(layer, MergedLayer) for layer in engine.cache.block_layers)
    assert [o.generated_tokens for o in outs] == stock_greedy(model, prompts, 12)


def test_identity_merge_keeps_plain_layers(model):
    engine, _ = run(model, ragged_prompts([6], seed=2), 2, head_merge=((0, 1, 2, 3), (0, 1, 2, 3)))
    assert all(type(layer).__name__ == "PagedLayer" for layer in engine.cache.block_layers)


@pytest.mark.parametrize("merge", [MERGE, ((0, 0, 2, 2), (0, 1, 0, 1))])
def test_batched_preempted_and_prefix_shared_runs_match_runs_alone(merge):
    check_engine_parity({"block_size": 4, "head_merge": merge})


def test_merged_plan_equals_the_reference_with_one_head_clusters():
    """Prefill, ragged decodes and a cascade (shared leading blocks) against the torch reference, head by head."""
    torch.manual_seed(0)
    bs, blocks, heads, kv_heads, dim = 4, 40, 4, 2, 8
    keys, values = torch.randn(blocks, bs, kv_heads, dim), torch.randn(blocks, bs, kv_heads, dim)
    shared = list(range(5))  # five blocks every decode row shares: the cascade path
    tables = torch.tensor([shared + [5, 6, 7], shared + [8, 9, 10], shared + [11, 12, 13], [20, 21, 22, 23, 24, 25,
                                                                                         26, 27]])
    context_lens, q_lens = [30, 23, 25, 17], [1, 1, 1, 9]
    qsl = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    plan = build_attention_plan(tables, qsl, context_lens, bs, in_place=True)
    assert plan.prefills and plan.decodes and plan.decodes[0].shared_blocks is not None
    q = torch.randn(qsl[-1], heads, dim)
    identity = MergedIndices(LayerMerge((0, 1, 2, 3), kv_heads), q.device)
    want = run_attention_plan(plan, q, keys, values, scale=0.3)
    torch.testing.assert_close(run_merged_plan(plan, identity, q, keys, values, scale=0.3), want)
    # merged: keys of KV head 0 only; heads 2, 3 use heads 0, 1's probabilities on KV head 1's values
    merged = MergedIndices(LayerMerge((0, 1, 0, 1), kv_heads), q.device)
    got = run_merged_plan(plan, merged, q, keys[:, :, :1].contiguous(), values, scale=0.3)
    swapped_values = values.flip(2)  # heads 0, 1 on KV head 1's values: the reference's heads 2, 3 as merged
    ref_heads_01 = run_attention_plan(plan, q, keys, swapped_values, scale=0.3)[:, :2]
    torch.testing.assert_close(got[:, 2:], ref_heads_01)
    torch.testing.assert_close(got[:, :2], want[:, :2])
    # unequal clusters per key head (KV 0: heads 0, 1; KV 1: head 2 for heads 2 and 3): the keys gathered per cluster
    uneven = MergedIndices(LayerMerge((0, 1, 2, 2), kv_heads), q.device)
    assert uneven.clusters_per_key is None
    got = run_merged_plan(plan, uneven, q, keys, values, scale=0.3)
    torch.testing.assert_close(got[:, :3], want[:, :3])
    torch.testing.assert_close(got[:, 3], want[:, 2])


def test_key_bytes_are_saved_in_the_pool(model):
    plain = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=10))
    merged = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=10, head_merge=MERGE))
    for cache in (plain, merged):
        for layer in cache.block_layers:
            layer.lazy_initialization(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    # per layer: plain 2 key + 2 value heads; merged 1 key + 2 value heads
    assert merged.stats()["kv_bytes_allocated"] * 4 == plain.stats()["kv_bytes_allocated"] * 3
    assert merged.stats()["kv_bytes_per_block"] == 2 * 4 * 3 * 8 * 4
    assert merged.block_layers[0].key_cache.shape == (10, 4, 1, 8)
    budget = 20 * plain.stats()["kv_bytes_per_block"]  # the same budget buys a third more merged blocks
    assert PagedCache(model.config, PagedConfig(block_size=4, max_cache_bytes=budget, head_merge=MERGE)).num_blocks \
        == 20 * 4 // 3


@pytest.mark.parametrize("table, message", [
    (((0, 0, 0, 0),), "has 1 layers but the model has 2"),
    (((0, 0, 0), (0, 1, 2)), "names 3 query heads but the model has 4"),
])
def test_merges_that_do_not_fit_the_model_are_refused(model, table, message):
    with pytest.raises(InvalidConfigError, match=message):
        PagedCache(model.config, PagedConfig(head_merge=table))


@pytest.mark.parametrize("overrides, message", [
    ({"head_merge": ((0, 2, 1, 3),)}, "must be a head of the layer that represents itself"),
    ({"head_merge": "((0, 1),)"}, "must be None or one tuple per layer"),
    ({"head_merge": MERGE, "kv_cache_dtype": "int8"}, "does not work with kv_cache_dtype='int8'"),
    ({"head_merge": MERGE, "kv_pruning": "snapkv", "kv_keep_ratio": 0.5}, "does not work with kv_pruning='snapkv'"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        PagedConfig(**overrides)


def test_stock_cache_path_is_refused(model):
    cache = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=16, head_merge=MERGE))
    with pytest.raises(UnsupportedGenerationError, match="serves the paged engine only"):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, do_sample=False, cache=cache)


def test_layer_merge_groups_keys_by_representatives():
    merge = LayerMerge((0, 0, 2, 3, 0, 0, 2, 3), 2)  # the module doc's example
    assert merge.rep_heads == (0, 2, 3) and merge.kept_kv_heads == (0,) and merge.kv_fraction == 0.75
    assert merge.cluster_of == (0, 0, 1, 2, 0, 0, 1, 2) and merge.key_of_cluster == (0, 0, 0)
    assert LayerMerge((0, 0, 2, 2), 2).kept_kv_heads == (0, 1)  # within-group merges keep both key heads


def test_choose_merge_follows_the_gqa_rule():
    d = torch.full((4, 4), 0.5).fill_diagonal_(0)
    d[2, 0] = d[0, 2] = 0.05  # head 2 (KV 1) is close to head 0; head 3 (KV 1) is close to nothing
    # KV 1 cannot drop (head 3 has no kept neighbour); head 2 still follows head 0: one score fewer, no bytes
    assert choose_layer_merge(d, 2, 0.1) == (0, 1, 0, 3)
    assert choose_layer_merge(d, 2, 0.1, score_threshold=0) == (0, 1, 2, 3)
    assert choose_layer_merge(d, 2, 0.0) == (0, 1, 2, 3)
    d[3, 1] = d[1, 3] = 0.08
    assert choose_layer_merge(d, 2, 0.1) == (0, 1, 0, 1)  # KV 1 dropped: heads 2, 3 follow 0, 1
    assert choose_layer_merge(d, 2, 1.0) == (0, 0, 0, 0)  # one cluster
    assert choose_layer_merge(d, 2, 1.0, score_threshold=0) == (0, 1, 0, 1)  # kept heads stay their own
    d[1, 0] = d[0, 1] = 0.0  # identical maps: merged even at score_threshold 0 (exact)
    assert choose_layer_merge(d, 2, 1.0, score_threshold=0) == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        plan_from_distances(d[None], 2, 1.5)


def test_identical_heads_are_merged_and_change_nothing(tmp_path):
    """KV head 1 of layer 0 made a copy of KV head 0 (query and key weights): calibration merges heads 2, 3 into
    0, 1 and drops KV head 1's keys there; the tokens stay the model's own."""
    model = tiny_model("llama", seed=5)
    attn, dim = model.model.layers[0].self_attn, 8
    with torch.no_grad():
        attn.k_proj.weight[dim : 2 * dim] = attn.k_proj.weight[:dim]
        attn.q_proj.weight[2 * dim : 4 * dim] = attn.q_proj.weight[: 2 * dim]
    samples = ragged_prompts([40, 30], seed=8)
    plan = calibrate_head_merge(model, samples, threshold=1e-6)
    assert plan.representatives == ((0, 1, 0, 1), (0, 1, 2, 3))
    assert plan.kv_fraction == (0.75 + 1.0) / 2
    plan.save(tmp_path / "merge.json")
    assert HeadMergePlan.load(tmp_path / "merge.json").representatives == plan.representatives
    prompts = ragged_prompts([12, 20], seed=9)
    _, outs = run(model, prompts, 10, head_merge=plan.representatives)
    assert [o.generated_tokens for o in outs] == stock_greedy(model, prompts, 10)
