"""Whether the paged engine can drive a model: checks of its class and config only (no forward, no weights).

Used by `wrap` and by the draft-model drafter of speculative decoding.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from hf_paged.errors import UnsupportedModelError

__all__ = ["check_supported"]

# Families whose attention bypasses transformers' AttentionInterface, calls cache.update without its kwargs, or does
# what the paged attention does not (each found to give other tokens than stock, or to crash, in a sweep of every
# causal-LM type of transformers 5.25: tests/test_model_support.py).
_NO_KWARGS = "its attention calls cache.update without the attention kwargs"
_CACHE_POSITIONS = "its decoder takes positions from the cache's length, not from the step's positions"
_UNSUPPORTED_MODEL_TYPES = {
    "gpt_neox": _NO_KWARGS,
    "falcon": _NO_KWARGS,
    "ctrl": _NO_KWARGS,
    "bloom": "its attention bypasses transformers' AttentionInterface",
    "mpt": "its attention bypasses transformers' AttentionInterface",
    "stablelm": "its decoder layer calls self_attn without the attention kwargs",
    "nemotron": "its decoder layer calls self_attn without the attention kwargs",
    "doge": "its attention adds a learned dynamic mask, which the paged attention does not apply",
    "diffllama": "each layer calls the attention function twice (once per half of the values)",
    "hrm_text": "it runs one stack of layers several times per token, with a cache entry per cycle",
    "git": "its text attention runs inline on what cache.update returns",
    "mllama_text_model": "its cross-attention layers read the vision states, not a paged cache",
    "gemma4_text": "its layers have head dims of their own, which the paged pool does not size",
    "gemma4_unified_text": "its layers have head dims of their own, which the paged pool does not size",
    "marian": _CACHE_POSITIONS,
    "pegasus": _CACHE_POSITIONS,
    "bigbird_pegasus": _CACHE_POSITIONS,
    "blenderbot": _CACHE_POSITIONS,
}
_SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}


def check_supported(model: torch.nn.Module) -> None:
    """Raise `UnsupportedModelError` saying why the engine cannot drive this model."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "generate"):
        inner = getattr(model, "module", None)
        if hasattr(inner, "config") and hasattr(inner, "generate"):  # DistributedDataParallel, DataParallel, ...
            raise UnsupportedModelError(
                f"{name} holds the model in .module; wrap that one: hf_paged.wrap(model.module) (the same weights, "
                "which training through the wrapper keeps updating)"
            )
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
    # (a wrapper around a model, PEFT's or torch.compile's, passes the keyword on: only a model's own class is read)
    if isinstance(model, PreTrainedModel) and "logits_to_keep" not in inspect.signature(type(model).forward).parameters:
        raise UnsupportedModelError(f"{name}'s forward takes no logits_to_keep, so the engine cannot ask it for each "
                                    "sequence's last position; use stock generate")
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise UnsupportedModelError(f"{name} is in {dtype}: the paged KV pool and attention hold float32, bfloat16 or "
                                    "float16 (every request failed in the kernels); convert it (model.float()) or use "
                                    "stock generate")
    if any(getattr(module, "sinks", None) is not None for module in model.modules()):
        raise UnsupportedModelError(f"{name} ({model_type}) has attention sinks (a learned logit per head in every "
                                    "softmax), which the paged attention does not apply; use stock generate")
