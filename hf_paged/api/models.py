"""The embedded default model: a tiny byte-level Llama trained by `scripts/train_tiny_lm.py`.

It ships inside the package (`hf_paged/assets/tiny-lm/`) so that tests, benchmarks and the demo have a real
trained model, with real attention patterns, on a machine without network. It loads like any hub model:
`AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)` and `AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)`.
The model card (`README.md` in that folder) lists its settings and measured quality.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["DEFAULT_MODEL_PATH", "DefaultModel", "default_model"]

DEFAULT_MODEL_PATH = Path(__file__).resolve().parent.parent / "assets" / "tiny-lm"


class DefaultModel(NamedTuple):
    """The default model and its tokenizer (a NamedTuple so `model, tokenizer = default_model()` works)."""

    model: PreTrainedModel  # LlamaForCausalLM in eval mode
    tokenizer: PreTrainedTokenizerBase  # byte-level: ids 0-255 are bytes, then <|bos|>, <|eos|>, <|pad|>


def default_model(*, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> DefaultModel:
    """Load the embedded tiny byte-level Llama and its tokenizer, offline.

    Args:
        dtype (`torch.dtype`, *optional*, defaults to `torch.float32`): dtype of the weights once loaded
            (the checkpoint is stored in float16; float32 is what the parity tests use).
        device (`str` or `torch.device`, *optional*, defaults to `"cpu"`): where to put the model.

    Returns:
        `DefaultModel`: `(model, tokenizer)`, the model in eval mode.

    Example:
        >>> model, tokenizer = default_model()
        >>> ids = tokenizer("def main():", return_tensors="pt").input_ids
        >>> out = model.generate(ids, max_new_tokens=8, do_sample=False)
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (DEFAULT_MODEL_PATH / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"default_model: no checkpoint at {DEFAULT_MODEL_PATH}; run `python scripts/train_tiny_lm.py` "
            "to train it, or reinstall hf_paged with its package data"
        )
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=dtype, local_files_only=True)
    model.to(device).eval()  # type: ignore[arg-type]  # transformers types `to` through a wrapper
    # left padding: a decoder-only model continues each row from its last token (stock generate warns otherwise)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH, local_files_only=True, padding_side="left")
    return DefaultModel(model=model, tokenizer=tokenizer)
