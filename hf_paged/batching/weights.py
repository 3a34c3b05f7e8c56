"""Detect a change of what a model computes: its weights (an optimizer step, a `load_state_dict`, a dtype or device
move, an edit through `.data`) or its modules' behaviour (a hook added or removed, a PEFT adapter turned off, on or
switched), any of which makes the K/V the prefix cache holds stale.

Four signals, all cheap enough for every step that admits requests:
- each parameter's and buffer's storage, dtype, device and version counter (an in-place op under `no_grad` moves it);
- the number of optimizer steps taken in this process (`torch.optim` step hook): fused optimizers (AdamW's
  `fused=True`, Trainer's default `adamw_torch_fused`) write the weights without moving their version counters;
- a few values of the first, middle and last parameter: an edit through `.data` (EMA, hand-written update loops)
  moves neither. An edit through `.data` of other tensors only is not seen: call `Engine.reset_prefix_cache()`;
- each module's forward hooks (their handle ids), a per-instance `forward`, and PEFT's per-layer adapter state
  (`disable_adapters`, `active_adapters`, `merged_adapters`: public attributes of its tuner layers).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from hf_paged.compat import forward_hook_keys, own_parameters_and_buffers

_SAMPLES = 8  # values read from each sampled parameter
_optimizer_steps = 0


def _count_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_step)


def _version(p: torch.Tensor) -> int:
    if p.is_inference():  # inference tensors keep no version counter; they are only written under inference_mode
        return -1
    return p._version


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """`weights_fingerprint`'s two parts: a change of `weights` makes copies of the weights stale too (the lean
    forward's); one of `behaviour` (hooks, adapters) only the K/V computed under it."""

    weights: int
    behaviour: int


def weights_fingerprint(model: torch.nn.Module) -> Fingerprint:
    """Changes whenever a parameter or buffer is modified in place (its version counter moves) or replaced (its
    storage, dtype or device changes), after any optimizer step of this process, and when the sampled values of the
    first, middle or last parameter change; also when a module's hooks or per-instance forward, or a PEFT layer's
    adapter state, change. One pass over the module tree and three small reads."""
    params, buffers, behaviour = [], [], []
    for i, module in enumerate(model.modules()):  # one walk of the module tree (a tied weight is listed twice)
        own_params, own_buffers = own_parameters_and_buffers(module)
        params += own_params
        buffers += own_buffers
        hooks = forward_hook_keys(module)
        if hooks:
            behaviour.append((i, hooks))
        if _is_tuner_layer(type(module)):
            behaviour.append((i, _adapter_state(module)))
    state = tuple((t.data_ptr(), _version(t), t.dtype, t.device) for t in itertools.chain(params, buffers))
    picks = params[:1] + params[len(params) // 2:][:1] + params[-1:] if params else []
    with torch.no_grad():
        samples = tuple(_sample(p.to_local() if hasattr(p, "to_local") else p)  # (a DTensor: this rank's shard)
                        for p in picks if not p.is_meta)
    return Fingerprint(hash((state, _optimizer_steps, samples)), hash(tuple(behaviour)))


@functools.cache
def _is_tuner_layer(cls: type) -> bool:
    """A PEFT tuner layer (LoRA and the others): `disable_adapters` is a property of its class (transformers'
    `PreTrainedModel` has a method of that name)."""
    return isinstance(getattr(cls, "disable_adapters", None), property)


def _adapter_state(layer) -> tuple:
    """Whether its adapters are off, which are active, which are merged (names only)."""
    def names(value) -> tuple:
        return (value,) if isinstance(value, str) else tuple(str(v) for v in value or ())

    return (bool(layer.disable_adapters), names(getattr(layer, "active_adapters", ())),
            names(getattr(layer, "merged_adapters", ())))


def tensor_stamp(t: torch.Tensor) -> tuple:
    """What says one tensor changed (a copy made of it is stale): its storage, version counter, shape, the
    process's optimizer steps and a few of its values (`weights_fingerprint`'s signals, for one tensor)."""
    with torch.no_grad():
        return t.data_ptr(), _version(t), tuple(t.shape), _optimizer_steps, _sample(t)


def _sample(t: torch.Tensor) -> tuple:
    flat = t.detach().reshape(-1)
    return tuple(flat[:: max(1, flat.numel() // _SAMPLES)][:_SAMPLES].tolist())
