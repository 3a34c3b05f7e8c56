"""Autocast and the paged engine: the engine computes in the weights' dtype; it does not follow autocast.

Under `torch.autocast` the projections return bf16 (or fp16) while RoPE's products and the pool keep the weights'
dtype: a fresh engine's first forward failed (keys fp32, values bf16: `KernelArgumentError`, and the pool kept those
dtypes, so every later request failed too) and a warm one stored rounded keys and values, which neither stock under
autocast nor stock without it computes. So the engine's forwards run with autocast off (`ModelRunner`), a wrapped
`generate` under autocast runs stock `generate` (with `PagedFallbackWarning`), and a model whose forward accelerate
wrapped in autocast (Trainer / `Accelerator` mixed precision, `bf16=True` or `fp16=True` on fp32 weights; the
wrapper turns it on again inside every forward) is refused by `generate_batch` and `loglikelihood` with what to pass
instead. `PagedGenerationCallback` sets that wrapper aside for its own generation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from hf_paged.compat import execution_device
from hf_paged.errors import UnsupportedGenerationError


def _device_type(model: torch.nn.Module) -> str | None:
    """The type of the device the model computes on, where autocast exists for it (else None)."""
    device = execution_device(model).type  # (offloaded weights sit on the meta device: where their hooks compute)
    return device if torch.amp.is_autocast_available(device) else None


def autocast_reason(model: torch.nn.Module) -> str | None:
    """Why a forward called now runs under autocast (`generate`'s reason to run stock), or None: `torch.autocast`
    is on, in this thread, for the model's device, or accelerate wrapped the model's forward in it."""
    device = _device_type(model)
    if device is not None and torch.is_autocast_enabled(device):
        return "torch.autocast (the engine computes in the weights' dtype)"
    if mixed_precision_forward(model):
        return "autocast in accelerate's mixed-precision forward (the engine computes in the weights' dtype)"
    return None


def mixed_precision_forward(model: torch.nn.Module) -> bool:
    """Whether accelerate replaced `model.forward` with its autocast wrapper (`Accelerator.prepare_model` with mixed
    precision keeps the forward it wrapped as `model._original_forward`)."""
    wrapper, original = model.__dict__.get("forward"), model.__dict__.get("_original_forward")
    return wrapper is not None and original is not None and original is not wrapper


def refuse_mixed_precision_forward(model: torch.nn.Module, what: str) -> None:
    """`what`'s refusal (`generate_batch`, `loglikelihood`) of a model whose forward accelerate wrapped in autocast."""
    if mixed_precision_forward(model):
        raise UnsupportedGenerationError(
            f"{what} on a model whose forward accelerate wrapped in autocast (mixed precision: Trainer "
            "bf16=True / fp16=True): the engine computes in the weights' dtype and does not follow autocast; pass "
            "accelerator.unwrap_model(model, keep_fp32_wrapper=False), or generate with PagedGenerationCallback, "
            "which sets the wrapper aside")


@contextmanager
def original_forward(model: torch.nn.Module) -> Iterator[None]:
    """Within: `model.forward` without accelerate's mixed-precision wrapper (the forward it wrapped: the class's, or
    an instance forward such as an offload hook's); the wrapper is put back after. Only for a caller that owns the
    model meanwhile (a training loop's own callback): another thread's forward would run without autocast."""
    if not mixed_precision_forward(model):
        yield
        return
    wrapper, original = model.__dict__["forward"], model.__dict__["_original_forward"]
    if getattr(original, "__self__", None) is model and getattr(original, "__func__", None) is type(model).forward:
        del model.__dict__["forward"]  # (the class's own forward: no instance attribute, as before accelerate)
    else:
        model.__dict__["forward"] = original
    try:
        yield
    finally:
        model.__dict__["forward"] = wrapper
