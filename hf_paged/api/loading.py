"""Loading a model for the `hf-paged` commands, the server and the replicas: a directory or hub id, with one-line
errors (`CliError`). Imports neither torch nor transformers until it loads: `serve --replicas` runs no model in its
own process (torch is ~0.2 GB of RSS)."""

from __future__ import annotations

from pathlib import Path

from hf_paged.errors import CliError

__all__ = ["CliError", "check_device", "load_model", "missing_model_path"]


def check_device(device: str) -> None:
    if device != "cuda":
        return  # no torch import: `serve --replicas` runs no model in this process (torch is ~0.2 GB RSS)
    import torch

    if not torch.cuda.is_available():
        raise CliError("--device cuda given but no CUDA device is available; use --device cpu")


def missing_model_path(path: str) -> bool:
    """Whether `path` names a local directory that is not there (a path: it starts with "/", "." or "~", or has more
    than one "/"); a hub id ("org/name", or one word such as "gpt2") is left to `from_pretrained`."""
    return not Path(path).expanduser().exists() and (path.startswith(("/", ".", "~")) or path.count("/") > 1)


def load_model(path: str, device: str = "cpu", dtype: str = "float32"):
    """Model and tokenizer from a directory or hub id, with one-line errors; `dtype="auto"`: the checkpoint's own
    (its config's `dtype`, float32 when it names none)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_device(device)
    if missing_model_path(path):
        raise CliError(f"model {path!r} not found: give a model directory or a hub id")
    path = str(Path(path).expanduser()) if path.startswith("~") else path
    try:
        weights = dtype if dtype == "auto" else getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=weights).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot load model {path!r}: {str(exc).splitlines()[0]}") from None
    return model, tokenizer
