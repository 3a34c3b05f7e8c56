"""Detect a change of what a model computes: its weights (an optimizer step, a `load_state_dict`, a dtype or device
move, an edit through `.data`) or its modules' behaviour (a hook added or removed, a PEFT adapter turned off, on or
switched), any of which makes the K/V the prefix cache holds stale.

Four signals, all cheap enough for every step that admits requests:
- each parameter's and buffer's storage, dtype, device and version counter (an in-place op under `no_grad` moves it);
- the number of optimizer steps taken in this process (`torch.optim` step hook): fused optimizers (AdamW's
  `fused=True`, Trainer's default `adamw_torch_fused`) write the weights without moving their version counters;
- a few values of the first, middle and last parameter: an edit through `.data` (EMA, hand-written update loops)
  moves neither. An edit through `.data` of other tensors only, or of values between the sampled ones (a few rows
  of an embedding or of the head), is not seen: call `weights_changed()` (`hf_paged.weights_changed()`) after it;
- each module's forward hooks (their handle ids), a per-instance `forward`, and PEFT's per-layer adapter state
  (`disable_adapters`, `active_adapters`, `merged_adapters`, and the LoRA `scaling` that `set_scale` /
  `scale_layer` change: attributes of its tuner layers).

A change of values alone (an optimizer step in place, a `.data` edit) leaves the tensors where they are: the K/V
computed from them are stale, but what reads the tensors at every call (the lean forward, CUDA graphs recorded over
their addresses) is not, so only a change of storage, dtype, device or shape rebuilds those (`Fingerprint.weights`):
an RL loop that steps the optimizer between rollouts does not pay the lean forward's self-check (~0.2 s on a 100M
model on one CPU thread) at every rollout.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from hf_paged.compat import forward_hook_keys, own_parameters_and_buffers

_SAMPLES = 8  # values read from each sampled parameter
_changes = 0  # optimizer steps taken in this process, plus `weights_changed` calls


def _count_step(optimizer, args, kwargs) -> None:
    global _changes
    _changes += 1


register_optimizer_step_post_hook(_count_step)


def weights_changed() -> None:
    """Tell every engine of this process that weights changed where it cannot see it: after an edit through `.data`
    of some tensors only (a hand-written update of a few layers, new rows of an embedding or of the head; `.data` has
    a version counter of its own). At its next step that admits requests each engine drops its prefix cache, and
    copies of a weight (the bf16 copy of the head that certified greedy steps read) are made again. Edits in place
    under `torch.no_grad()`, optimizer steps, `load_state_dict` and replaced tensors need no call."""
    global _changes
    _changes += 1


def _version(p: torch.Tensor) -> int:
    if p.is_inference():  # inference tensors keep no version counter; they are only written under inference_mode
        return -1
    return p._version


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """`weights_fingerprint`'s three parts; a change of any makes the K/V computed before stale. A change of
    `weights` (where the tensors are) also makes stale what holds the tensors themselves (the lean forward, decode
    graphs); `values` (what they hold) and `behaviour` (hooks, adapters) do not."""

    weights: int  # each parameter's and buffer's storage, dtype, device and shape
    behaviour: int  # forward hooks, per-instance forwards, PEFT adapter state
    values: int = 0  # version counters, optimizer steps and `weights_changed` calls, sampled values


def weights_fingerprint(model: torch.nn.Module) -> Fingerprint:
    """Changes whenever a parameter or buffer is modified in place (its version counter moves) or replaced (its
    storage, dtype or device changes), after any optimizer step of this process, when the sampled values of the
    first, middle or last parameter change, and after `weights_changed()`; also when a module's hooks or
    per-instance forward, or a PEFT layer's adapter state, change. One pass over the module tree and three small
    reads."""
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
    tensors = tuple(itertools.chain(params, buffers))
    storage = tuple((t.data_ptr(), t.dtype, t.device, t.shape) for t in tensors)
    picks = params[:1] + params[len(params) // 2:][:1] + params[-1:] if params else []
    with torch.no_grad():
        samples = tuple(sample_values(p.to_local() if hasattr(p, "to_local") else p)  # (a DTensor: this rank's shard)
                        for p in picks if not p.is_meta)
    values = (tuple(_version(t) for t in tensors), _changes, samples)
    return Fingerprint(hash(storage), hash(tuple(behaviour)), hash(values))


@functools.cache
def _is_tuner_layer(cls: type) -> bool:
    """A PEFT tuner layer (LoRA and the others): `disable_adapters` is a property of its class (transformers'
    `PreTrainedModel` has a method of that name)."""
    return isinstance(getattr(cls, "disable_adapters", None), property)


def _adapter_state(layer) -> tuple:
    """Whether its adapters are off, which are active, which are merged (names only), and each adapter's scale
    (LoRA's `scaling`, a dict of plain numbers, that `set_scale` / `scale_layer` change without touching a weight)."""
    def names(value) -> tuple:
        return (value,) if isinstance(value, str) else tuple(str(v) for v in value or ())

    scaling = getattr(layer, "scaling", None)
    scales = tuple(sorted((str(k), repr(v)) for k, v in scaling.items())) if isinstance(scaling, dict) else ()
    return (bool(layer.disable_adapters), names(getattr(layer, "active_adapters", ())),
            names(getattr(layer, "merged_adapters", ())), scales)


def tensor_stamp(t: torch.Tensor) -> tuple:
    """What says one tensor changed (a copy made of it is stale): its storage, version counter, shape, the
    process's optimizer steps and `weights_changed` calls, and a few of its values (`weights_fingerprint`'s signals,
    for one tensor)."""
    with torch.no_grad():
        return t.data_ptr(), _version(t), tuple(t.shape), _changes, sample_values(t)


def sample_values(t: torch.Tensor) -> tuple:
    flat = t.detach().reshape(-1)
    return tuple(flat[:: max(1, flat.numel() // _SAMPLES)][:_SAMPLES].tolist())
