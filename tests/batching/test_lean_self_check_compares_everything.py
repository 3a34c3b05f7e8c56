"""The lean forward's self-check (`lean_forward._agrees`) refuses a model on any difference it can see: in any of
its probes (not only the last), in the keys or values a layer hands to attention (the probe attention's output reads
the queries only, so those show in its records, never in the logits), or in the sliding window; and a width where
pruning could change bits is never probed pruned at all."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama import modeling_llama

from hf_paged.batching import lean_forward
from hf_paged.batching.lean_forward import LeanForward
from tests.tiny_models import DECODER, tiny_model


def test_a_difference_in_the_first_probe_only_is_seen(monkeypatch):
    """The final norm computing otherwise on five tokens only: the prefill-shaped probe's logits differ, the other
    probes' agree, and no layer's records differ (the final norm comes after every attention)."""
    model = tiny_model("llama")
    norm = type(model.model.norm)
    stock_forward = norm.forward

    def forward(self, x):
        changed = self is model.model.norm and x.shape[-2] == 5
        return stock_forward(self, x) * (1.0001 if changed else 1.0)

    monkeypatch.setattr(norm, "forward", forward)
    assert LeanForward.build(model) is None
    monkeypatch.undo()
    assert LeanForward.build(model) is not None


def _rotary_that_changes(which: str):
    stock = modeling_llama.apply_rotary_pos_emb

    def rotary(q, k, cos, sin, *args, **kwargs):
        q, k = stock(q, k, cos, sin, *args, **kwargs)
        return (q, k * 1.0001) if which == "k" else (q, k)

    return rotary


def test_keys_that_differ_are_seen_though_the_logits_agree(monkeypatch):
    model = tiny_model("llama")
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", _rotary_that_changes("k"))
    assert LeanForward.build(model) is None


def test_values_that_differ_are_seen_though_the_logits_agree(monkeypatch):
    model = tiny_model("llama")
    v_proj = model.model.layers[0].self_attn.v_proj
    stock_forward = type(model.model.layers[0].self_attn).forward

    def forward(self, hidden_states, *args, **kwargs):  # the stock attention, its values scaled
        if self is model.model.layers[0].self_attn:
            with torch.no_grad():
                v_proj.weight.mul_(1.5)
            try:
                return stock_forward(self, hidden_states, *args, **kwargs)
            finally:
                with torch.no_grad():
                    v_proj.weight.div_(1.5)
        return stock_forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(type(model.model.layers[0].self_attn), "forward", forward)
    assert LeanForward.build(model) is None


def test_a_sliding_window_read_otherwise_is_seen(monkeypatch):
    """As if a transformers release moved the attribute the lean forward reads the window from."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**{**DECODER, "num_hidden_layers": 3}, use_sliding_window=True,
                                         sliding_window=8, max_window_layers=1)).eval()
    assert LeanForward.build(model) is not None
    monkeypatch.setitem(lean_forward._FAMILIES, "qwen2", lambda attn: None)
    assert LeanForward.build(model) is None


def test_a_width_with_a_scalar_tail_is_never_probed_pruned(one_thread, monkeypatch):
    """An intermediate size that is not a multiple of 32: pruning is ruled out before any probe (a probe that
    happened to agree would not show that the scalar tail rounds the same on other rows)."""
    probed = []
    agrees = lean_forward._agrees

    def counting(model, lean):
        probed.append(lean.prune)
        return agrees(model, lean)

    monkeypatch.setattr(lean_forward, "_agrees", counting)
    torch.manual_seed(0)
    odd = LlamaForCausalLM(LlamaConfig(**{**DECODER, "intermediate_size": 72})).eval()
    assert LeanForward.build(odd) is not None and probed == [False]
    probed.clear()
    assert LeanForward.build(tiny_model("llama")).prune and probed == [True]
