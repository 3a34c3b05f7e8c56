"""`wrap` / `unwrap` / `engine_of`: patch a stock causal LM so `generate` runs on the paged engine.

The model object stays what it was: `generate` and `generate_batch` become instance attributes (no class swap, so
`save_pretrained` and `isinstance` are unaffected), the engine hangs off `model._hf_paged`, and the model's
attention implementation is only switched during the engine's own forwards.
"""

from __future__ import annotations

from dataclasses import fields
from types import MethodType
from typing import Any

import torch

from hf_paged.api.wrap_state import _MISSING, _STATE_ATTR, _WrapState, engine_of, is_wrapped  # noqa: F401
from hf_paged.cache.model_support import check_supported
from hf_paged.config import PagedConfig, unknown_fields_message
from hf_paged.errors import InvalidConfigError, UnsupportedModelError

_PATCHED = ("generate", "generate_batch", "loglikelihood", "loglikelihood_rolling")


def wrap(model: torch.nn.Module, config: PagedConfig | None = None, **overrides: Any) -> torch.nn.Module:
    """Make `model.generate` / `model.generate_batch` run on the paged continuous-batching engine.

    Args:
        model: a transformers causal LM (decoder-only, attention through `AttentionInterface`).
        config: a `PagedConfig`; keyword `overrides` change single fields (`wrap(model, block_size=32)`).

    Returns:
        The same model object, patched. Wrapping an already wrapped model with no new settings is a no-op.

    Raises:
        UnsupportedModelError: `model` is not a transformers generative model object (e.g. a hub id string), or
            one the engine cannot drive: an encoder-decoder, a family whose attention bypasses
            `AttentionInterface` (GPT-NeoX, Falcon, Bloom, MPT), linear-attention layers, no language-model head,
            weights in float64 (the engine holds float32, bfloat16 or float16);
            a tensor-parallel model whose KV heads the ranks cannot split evenly, or one loaded with pipeline,
            FSDP, expert or sequence parallelism beside it (`hf_paged.distributed.tensor_parallel`). Also a
            `TypeError`.
        InvalidConfigError: `config` is not a `PagedConfig`, an override names no `PagedConfig` field, or the
            model is already wrapped with different settings (call `hf_paged.unwrap(model)` first); settings that
            name KV heads or score them (`kv_streaming_heads`, `kv_full_precision_heads`, SnapKV/PyramidKV) with a
            tensor-parallel model. Also a `ValueError` and a `TypeError`.
        ValueError, TypeError: an override value that `PagedConfig` rejects (the message names the field).

    Nothing is allocated here (on a CPU fp32 model the attention kernels start loading: numba is imported now, the
    rest happens in a background thread). The first `generate` / `generate_batch` (or `engine_of`) builds the engine and
    its KV pool and raises `InvalidConfigError` for a pool larger than the device's memory; `generate` raises
    `InvalidPromptError` / `PromptTooLongError` for bad prompts, `generate_batch` `InvalidPromptError` for ids
    outside the vocabulary (see `hf_paged.errors`).

    Example:
        >>> model = hf_paged.wrap(AutoModelForCausalLM.from_pretrained(path))     # doctest: +SKIP
        >>> model.generate(input_ids, attention_mask=mask, max_new_tokens=32)     # doctest: +SKIP
    """
    if not isinstance(model, torch.nn.Module):
        raise UnsupportedModelError(
            f"wrap expects a loaded transformers model, got {type(model).__name__}; load it first, e.g. "
            "hf_paged.wrap(AutoModelForCausalLM.from_pretrained(path)) or hf_paged.default_model().model"
        )
    if config is not None and not isinstance(config, PagedConfig):
        raise InvalidConfigError(
            f"config must be a hf_paged.PagedConfig, got {type(config).__name__}; pass PagedConfig(...) or the "
            "fields as keywords (wrap(model, block_size=32))"
        )
    message = unknown_fields_message(overrides)
    if message:
        raise InvalidConfigError(message)
    asked = config is not None or bool(overrides)  # (a bare `wrap(model)` of a wrapped model keeps its settings)
    base = config or PagedConfig()
    config = base.with_overrides(**overrides) if overrides else base
    state: _WrapState | None = model.__dict__.get(_STATE_ATTR)
    if state is not None:
        if asked and config != state.config:  # (an explicit PagedConfig equal to the defaults was ignored)
            differ = [f"{f.name}: {getattr(state.config, f.name)!r} -> {getattr(config, f.name)!r}"
                      for f in fields(config) if getattr(config, f.name) != getattr(state.config, f.name)]
            raise InvalidConfigError(
                f"model is already wrapped with a different PagedConfig ({'; '.join(differ)}); call "
                "hf_paged.unwrap(model) first"
            )
        return model
    check_supported(model)
    from hf_paged.api.generate import paged_generate, paged_generate_batch
    from hf_paged.api.scoring import loglikelihood, loglikelihood_rolling
    from hf_paged.distributed.tensor_parallel import check_tensor_parallel

    check_tensor_parallel(model, config)  # a tp_plan model: what the engine cannot run with it is refused here

    _prepare_cpu_kernels(model, config)
    saved = {name: model.__dict__.get(name, _MISSING) for name in _PATCHED}
    object.__setattr__(model, _STATE_ATTR, _WrapState(config, saved))
    model.__dict__["generate"] = MethodType(paged_generate, model)
    model.__dict__["generate_batch"] = MethodType(paged_generate_batch, model)
    model.__dict__["loglikelihood"] = MethodType(loglikelihood, model)
    model.__dict__["loglikelihood_rolling"] = MethodType(loglikelihood_rolling, model)
    return model


def _prepare_cpu_kernels(model: torch.nn.Module, config: PagedConfig) -> None:
    """A CPU fp32 model's attention kernels start loading now (numba imported here, the rest in the background),
    so the first request neither waits for them nor shares the GIL with their imports."""
    param = next(model.parameters(), None)
    if (param is None or param.device.type != "cpu" or param.dtype != torch.float32
            or config.attention_backend != "auto"):
        return
    from hf_paged.cache.kernels import cpu_warm

    cpu_warm.prepare([cpu_warm.variant_for(config)])


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Undo `wrap`: the model is exactly as before (its engine and cache are released)."""
    state: _WrapState | None = model.__dict__.pop(_STATE_ATTR, None)
    if state is None:
        return model
    if state.engine is not None and state.engine._loop is not None:
        state.engine._loop.shutdown(reason="the model was unwrapped (hf_paged.unwrap) while this request ran")
    for name, value in state.saved.items():
        if value is _MISSING:
            model.__dict__.pop(name, None)
        else:
            model.__dict__[name] = value
    return model


