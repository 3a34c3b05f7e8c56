"""The `hf_paged` attention function: each request's queries attend to its own blocks.

Registered under the name "hf_paged" in transformers' `AttentionInterface`. The engine switches a wrapped model
to it only for the duration of its own packed forwards (see `hf_paged.batching.model_runner`), so a plain forward
of a wrapped model (training, scoring) keeps its stock attention and masks.

    query  [1, num_heads, T, head_dim]    packed new tokens of every request of the step
    key    [1, num_kv_heads, T, head_dim] the step's new K (and `value`), handed through by `cache.update`
    paged_backend                         the step's attention backend (model kwarg, `attention_backends`): it
                                          has the layer store them (`update_packed` -> a typed `LayerKV`) and
                                          attends over what the layer returned

The function only translates layouts and finds the layer (`module.layer_idx`, required); every choice of kernel is
the backend's, made once per step.
"""

from __future__ import annotations

import torch

from hf_paged.cache.attention_backends import TorchBackend
from hf_paged.cache.layer_kv import layer_index
from hf_paged.errors import UnsupportedModelError

ATTENTION_NAME = "hf_paged"


# tensors a model hands its attention function that say where the tokens are, which the engine's plan already knows
_POSITIONAL_KWARGS = frozenset({"position_ids", "cache_position", "cu_seq_lens_q", "cu_seq_lens_k"})


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    paged_backend: TorchBackend | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if paged_backend is None:
        raise RuntimeError(
            "the hf_paged attention ran without `paged_backend`: it only serves the paged engine's forwards; "
            "use the model's stock attention for plain forwards"
        )
    if key.dim() != 4 or query.shape[0] != 1 or key.shape[0] != 1:
        raise RuntimeError(
            "the hf_paged attention expects packed queries [1, heads, tokens, dim] and the step's new keys "
            f"[1, kv_heads, tokens, dim]; got query {tuple(query.shape)} and key {tuple(key.shape)}: the model "
            "probably calls cache.update without its attention kwargs (unsupported model)"
        )
    unknown = sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k not in _POSITIONAL_KWARGS)
    if unknown:  # data the paged attention would drop (gpt-oss's `s_aux` sinks, a bias): other tokens, silently
        raise UnsupportedModelError(f"{type(module).__name__} passes {unknown} to its attention function, which the "
                                    "paged attention does not apply; use stock generate for this model")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # [1, heads, T, dim] -> [T, heads, dim]
    out = paged_backend.forward(layer_index(module), query[0].transpose(0, 1), key[0].transpose(0, 1),
                                value[0].transpose(0, 1), scale=scale, sliding_window=sliding_window,
                                softcap=softcap)
    return out.unsqueeze(0), None


def attend_packed(backend: TorchBackend, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, *, scaling: float, sliding_window: int | None) -> torch.Tensor:
    """What a stock attention module does with the paged cache and "hf_paged", for callers holding the step's
    q/k/v packed as `[T, heads, dim]` (the engine's lean forward): the same backend call, without the layouts of
    transformers' interface; returns `[T, heads, dim]`."""
    return backend.forward(layer_index(module), query, key, value, scale=scaling, sliding_window=sliding_window,
                           softcap=None)


def register() -> None:
    """Register the attention function with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
