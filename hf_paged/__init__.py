"""hf_paged: paged KV cache, prefix sharing, KV compression, constrained decoding and continuous batching for
Hugging Face transformers causal LMs."""

from __future__ import annotations

from hf_paged import errors
from hf_paged.config import PagedConfig

__all__ = ["PagedConfig", "errors"]
__version__ = "0.1.0"
