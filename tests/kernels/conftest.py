"""Kernel tests run the Triton kernels in the CPU interpreter unless a CUDA device is present.

The flag must be set before triton is first imported (its own `tl.max`, `tl.sum` are jit functions built at
import) and before our kernels are defined (at first use). `tests/conftest.py` sets it first thing, which is what
covers whole-suite runs where an earlier test module imports transformers (and with it triton); this line keeps
the folder self-contained. If the order is ever wrong, the kernels raise a RuntimeError that says so.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
