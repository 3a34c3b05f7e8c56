"""A stored block is loaded only by an engine whose model computes the same K/V: the fingerprint reads every value of
every tensor (one changed value anywhere changes it), a weight or behaviour change inside a running engine keeps its
own older blocks out, and blocks computed under token pruning and without it never mix."""

from __future__ import annotations

import copy

import torch

from hf_paged.kv_transfer import model_fingerprint
from hf_paged.kv_transfer.weights_checksum import tensor_checksum
from tests.kv_transfer.test_engine_transfer import MAX_NEW, disk_engine, evict_all, run, transfer_stats
from tests.tiny_models import stock_greedy, tiny_model


def test_the_checksum_sees_any_one_changed_value_and_a_swap():
    g = torch.Generator().manual_seed(0)
    for dtype, n in ((torch.float32, 300), (torch.bfloat16, 301), (torch.float16, 302), (torch.int8, 303)):
        t = (torch.randn(n, generator=g) * 10).to(dtype)
        base = tensor_checksum(t)
        for i in range(n):  # every position, one ulp-sized change of the stored bits
            changed = t.clone()
            changed.view(torch.uint8)[i * t.element_size()] ^= 1
            assert tensor_checksum(changed) != base, (dtype, i)
        swapped = t.clone()
        swapped[[3, 200]] = t[[200, 3]]
        assert t[3] == t[200] or tensor_checksum(swapped) != base
        assert tensor_checksum(t.clone()) == base  # values, not addresses
    big = torch.randn(3 * (1 << 20) + 5, generator=g)  # several chunks: a change in the last one counts too
    changed = big.clone()
    changed[-2] += 1
    assert tensor_checksum(changed) != tensor_checksum(big)
    assert tensor_checksum(big[1:]) != tensor_checksum(big[:-1])  # an unaligned view is read, not refused


def test_one_changed_value_changes_the_model_fingerprint():
    model = tiny_model("llama")
    base = model_fingerprint(model)
    assert model_fingerprint(tiny_model("llama")) == base  # the same weights in another object
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.1.self_attn.v_proj.weight"):
        other = copy.deepcopy(model)
        with torch.no_grad():
            other.get_parameter(name).view(-1)[1] += 1e-3  # an odd flat index: a strided sample missed it
        assert model_fingerprint(other) != base, name


def _trained_row(model, token: int) -> None:
    """One embedding row changed in its odd columns only (no value the old 512-sample fingerprint read)."""
    with torch.no_grad():
        row = model.model.embed_tokens.weight[token]
        row[1::2] += 3 * torch.randn(row[1::2].shape, generator=torch.Generator().manual_seed(4))


def test_a_model_with_one_trained_embedding_row_loads_no_block_of_the_other(model, prompts, tmp_path):
    writer = disk_engine(model, tmp_path)
    run(writer, prompts[:1])
    evict_all(writer)
    assert transfer_stats(writer)["saved_blocks"] >= 5
    trained = copy.deepcopy(model)
    _trained_row(trained, prompts[0][0])
    reader = disk_engine(trained, tmp_path)
    assert run(reader, prompts[:1]) == stock_greedy(trained, prompts[:1], MAX_NEW)
    assert transfer_stats(reader)["loaded_blocks"] == 0  # (the sampled fingerprint loaded all 5: other tokens)


def test_weights_changed_in_place_never_reload_the_engines_own_older_blocks(prompts, tmp_path):
    model = tiny_model("llama")
    engine = disk_engine(model, tmp_path)
    run(engine, prompts[:1])
    evict_all(engine)
    _trained_row(model, prompts[0][0])  # in place, under the running engine
    run(engine, [[5, 6, 7]])  # a step that admits: the engine sees the change before the prompt arrives
    assert run(engine, prompts[:1]) == stock_greedy(model, prompts[:1], MAX_NEW)
    assert transfer_stats(engine)["loaded_blocks"] == 0
    evict_all(engine, seed=98)  # the new weights' blocks are saved and come back
    assert run(engine, prompts[:1]) == stock_greedy(model, prompts[:1], MAX_NEW)
    assert transfer_stats(engine)["loaded_blocks"] == 5


def test_a_hook_on_the_same_weights_never_reloads_blocks_computed_without_it(prompts, tmp_path):
    model = tiny_model("llama")
    engine = disk_engine(model, tmp_path)
    run(engine, prompts[:1])
    evict_all(engine)
    hook = model.model.layers[0].self_attn.k_proj.register_forward_hook(lambda mod, args, out: out * 2)
    try:
        run(engine, [[5, 6, 7]])  # the engine sees the hook before the prompt arrives
        assert run(engine, prompts[:1]) == stock_greedy(model, prompts[:1], MAX_NEW)
        assert transfer_stats(engine)["loaded_blocks"] == 0
    finally:
        hook.remove()
    run(engine, [[5, 6, 7]])
    # Without the hook the model is the one that wrote the first blocks; this engine still never loads them (the
    # salt outlives the change), which costs hits only.
    assert run(engine, prompts[:1]) == stock_greedy(model, prompts[:1], MAX_NEW)
    assert transfer_stats(engine)["loaded_blocks"] == 0


def test_a_streaming_engine_loads_no_block_a_plain_prefill_computed(model, prompts, tmp_path):
    pruning = {"kv_pruning": "streaming", "num_sink_tokens": 8, "window_tokens": 16}
    plain = disk_engine(model, tmp_path / "shared", num_blocks=64)
    run(plain, prompts)
    with plain.lock:
        assert plain.scheduler.kv_transfer.save_cached() >= 5
    streaming = disk_engine(model, tmp_path / "shared", num_blocks=64, **pruning)
    alone = disk_engine(model, tmp_path / "empty", num_blocks=64, **pruning)
    assert run(streaming, prompts) == run(alone, prompts)  # full-attention K/V loaded would change the tokens
    assert transfer_stats(streaming)["loaded_blocks"] == 0


def test_reset_prefix_cache_after_an_edit_the_engine_cannot_see_loads_no_older_block(prompts, tmp_path):
    """An edit through `.data` of a tensor the engine's cheap check does not sample moves nothing it watches; the
    documented answer is `Engine.reset_prefix_cache()` (or `weights_changed()`). The reset alone must keep the
    disk tier's older blocks out: the connector takes the fingerprint (every value) again after a reset."""
    model = tiny_model("llama")
    engine = disk_engine(model, tmp_path)
    run(engine, prompts[:1])
    evict_all(engine)
    assert transfer_stats(engine)["saved_blocks"] >= 5
    v_proj = model.model.layers[0].self_attn.v_proj.weight
    with torch.no_grad():  # .data: no version counter moves; not a parameter the engine samples
        v_proj.data.copy_(torch.randn(v_proj.shape, generator=torch.Generator().manual_seed(5)))
    run(engine, [[5, 6, 7]])  # the engine steps and admits: it does not see the edit
    engine.reset_prefix_cache()
    assert run(engine, prompts[:1]) == stock_greedy(model, prompts[:1], MAX_NEW)
    assert transfer_stats(engine)["loaded_blocks"] == 0
