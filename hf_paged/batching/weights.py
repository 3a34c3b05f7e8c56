"""Detect a change of a model's weights (an optimizer step, a `load_state_dict`, a dtype or device move)."""

from __future__ import annotations

import torch


def _version(p: torch.Tensor) -> int:
    if p.is_inference():  # inference tensors keep no version counter; they are only written under inference_mode
        return -1
    return p._version


def weights_fingerprint(model: torch.nn.Module) -> int:
    """Changes whenever any parameter is modified in place (its version counter moves) or replaced (its storage,
    dtype or device changes). Costs one pass over the parameter list, no arithmetic on the weights."""
    return hash(tuple((p.data_ptr(), _version(p), p.dtype, p.device) for p in model.parameters()))
