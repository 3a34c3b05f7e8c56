"""Whether the paged engine can drive a model: checks of its class and config only (no forward, no weights).

Used by `wrap` and by the draft-model drafter of speculative decoding.
"""

from __future__ import annotations

import torch

from hf_paged.errors import UnsupportedModelError

__all__ = ["check_supported"]

# Families whose attention bypasses transformers' AttentionInterface or calls cache.update without its kwargs.
_UNSUPPORTED_MODEL_TYPES = {
    "gpt_neox": "its attention calls cache.update without the attention kwargs",
    "falcon": "its attention bypasses transformers' AttentionInterface",
    "bloom": "its attention bypasses transformers' AttentionInterface",
    "mpt": "its attention bypasses transformers' AttentionInterface",
    "stablelm": "its decoder layer calls self_attn without the attention kwargs",
    "nemotron": "its decoder layer calls self_attn without the attention kwargs",
}
_SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}


def check_supported(model: torch.nn.Module) -> None:
    """Raise `UnsupportedModelError` saying why the engine cannot drive this model."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "generate"):
        raise UnsupportedModelError(f"{name} is not a transformers generative model (no config / generate)")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name} is an encoder-decoder model; hf_paged serves decoder-only causal LMs")
    model_type = getattr(config, "model_type", "")
    if model_type in _UNSUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"{name} ({model_type}) is not supported: {_UNSUPPORTED_MODEL_TYPES[model_type]}; use stock generate"
        )
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise UnsupportedModelError(
            f"{name} does not route attention through transformers' AttentionInterface; use stock generate"
        )
    text = config.get_text_config(decoder=True)
    layer_types = set(getattr(text, "layer_types", None) or ())
    if layer_types - _SUPPORTED_LAYER_TYPES:
        raise UnsupportedModelError(
            f"{name} has layer types {sorted(layer_types - _SUPPORTED_LAYER_TYPES)}; hf_paged pages full and "
            "sliding-window attention layers only"
        )
    if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is None:
        raise UnsupportedModelError(f"{name} has no language-model head; wrap the *ForCausalLM class")
