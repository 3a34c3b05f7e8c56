"""The lean forward is built only over the family's own module classes: a module of another class computes what its
class says, which a probe of five small tokens cannot always see (a clamp that large activations reach, a branch on
the sequence length), so it keeps the stock forward even where the probe agrees. That covers the MLP too, whose
projections and activation the lean forward reads directly."""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from hf_paged.batching.lean_forward import LeanForward
from tests.tiny_models import tiny_model


class _OwnNorm(LlamaRMSNorm):  # a subclass from outside transformers (a user's or a kernel library's)
    pass


class _ClampedMLP(LlamaMLP):
    """Computes the stock MLP and clamps it: the probe's activations never reach the clamp."""

    def forward(self, x):
        return super().forward(x).clamp(-1e3, 1e3)


def test_a_norm_of_another_class_keeps_the_stock_forward_even_where_the_probe_agrees():
    model = tiny_model("llama")
    norm = _OwnNorm(model.config.hidden_size, eps=model.config.rms_norm_eps)
    norm.load_state_dict(model.model.norm.state_dict())
    model.model.norm = norm
    assert LeanForward.build(model) is None


def test_an_mlp_of_another_class_keeps_the_stock_forward_even_where_the_probe_agrees():
    model = tiny_model("llama")
    layer = model.model.layers[1]
    mlp = _ClampedMLP(model.config)
    mlp.load_state_dict(layer.mlp.state_dict())
    layer.mlp = mlp
    x = torch.full((1, 1, model.config.hidden_size), 1e4)
    with torch.no_grad():  # what the lean forward would skip: the clamp
        assert not torch.equal(mlp(x), LlamaMLP.forward(mlp, x))
    assert LeanForward.build(model) is None
    layer.mlp = LlamaMLP(model.config)  # the family's own class again: lean
    assert LeanForward.build(model) is not None
