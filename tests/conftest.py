"""Test-wide setup: the Triton interpreter on machines without CUDA (set before any kernel is defined)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(torch.get_num_threads(), 2))
