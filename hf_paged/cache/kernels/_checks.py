"""Argument checks shared by the kernel entry points, run before any launch.

A Triton kernel given a wrong shape, dtype or stride does not fail: it reads or writes the wrong memory. So every
public function checks its tensors here first and raises `KernelArgumentError` naming the argument, what it got
and how to fix it. Only metadata is read (shapes, dtypes, strides, devices): nothing here synchronises the GPU.
"""

from __future__ import annotations

import torch

from hf_paged.errors import HfPagedError

__all__ = [
    "FLOAT_DTYPES",
    "KernelArgumentError",
    "check_backend",
    "check_dim",
    "check_dtype",
    "check_last_dim_contiguous",
    "check_ndim",
    "check_same_device",
    "check_scale",
    "check_sliding_window",
]

# Full-precision formats the kernels read and write; quantized caches come with the dequantizing variants.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BACKENDS = ("auto", "triton", "torch")


class KernelArgumentError(HfPagedError, ValueError):
    """A tensor passed to a paged-attention kernel has the wrong shape, dtype, stride or device."""


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise KernelArgumentError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")


def check_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise KernelArgumentError(f"{name} must be a torch.Tensor {layout}, got {type(tensor).__name__}")
    if tensor.dim() != ndim:
        raise KernelArgumentError(
            f"{name} must have {ndim} dimensions {layout}, got shape {tuple(tensor.shape)}; reshape it to {layout}"
        )


def check_dim(name: str, tensor: torch.Tensor, dim: int, expected: int, meaning: str) -> None:
    if tensor.shape[dim] != expected:
        raise KernelArgumentError(
            f"{name}.shape[{dim}] is {tensor.shape[dim]} but {meaning} is {expected}; got shape {tuple(tensor.shape)}"
        )


def check_dtype(name: str, tensor: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise KernelArgumentError(f"{name} must have dtype {names}, got {tensor.dtype}; convert it with .to(...)")


def check_same_device(tensors: dict[str, torch.Tensor]) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listed = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise KernelArgumentError(f"all tensors must be on one device, got {listed}; move them with .to(device)")
    return first


def check_last_dim_contiguous(tensors: dict[str, torch.Tensor]) -> None:
    # The kernels index the innermost dimension as offset 0, 1, 2, ...: other strides are passed, this one is not.
    for name, t in tensors.items():
        if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise KernelArgumentError(
                f"{name} must be contiguous in its last dimension, got strides {t.stride()}; pass {name}.contiguous()"
            )


def check_scale(scale: float) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise KernelArgumentError(f"scale must be a positive float (usually head_dim ** -0.5), got {scale!r}")


def check_sliding_window(sliding_window: int | None) -> None:
    if sliding_window is None:
        return
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise KernelArgumentError(
            f"sliding_window must be None or an int >= 1 (keys at positions > p - w are seen), got {sliding_window!r}"
        )
