"""Switch a stock transformers model to another registered attention function for a while.

A model reads `config._attn_implementation` at every forward, from its own config and from sub-configs (a
multimodal model's text config, ...). The engine switches to "hf_paged" only for its own packed forwards, and the
calibration helpers to "eager" or a masking function, so a plain forward of the same model keeps its attention.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.compat import get_attn_implementation, has_attn_implementation, set_attn_implementation


def attention_configs(model: torch.nn.Module) -> list[Any]:
    """Every config object the model's modules read the attention implementation from (one for most models)."""
    configs = {id(model.config): model.config}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and has_attn_implementation(config):
            configs[id(config)] = config
    return list(configs.values())


# Forwards of several engines over one model may overlap (threads), and switches may nest: each config keeps its
# own value and the switches in force, and always shows the latest one still in force (its own value when none).
_lock = threading.Lock()
renew_locks_after_fork(globals(), "_lock")  # a forked child gets a free lock (after_fork.py)
_active: dict[int, tuple[str | None, list[tuple[object, str]]]] = {}  # id(config) -> (own value, switches)


@contextmanager
def use_attention(configs: Sequence[Any], name: str) -> Iterator[None]:
    """Set every config in `configs` to the attention registered as `name`; restore each one's own afterwards,
    also on error."""
    token = object()
    with _lock:
        for config in configs:
            _own, switches = _active.setdefault(id(config), (get_attn_implementation(config), []))
            switches.append((token, name))
            set_attn_implementation(config, name)
    try:
        yield
    finally:
        with _lock:
            for config in configs:
                own, switches = _active[id(config)]
                switches[:] = [s for s in switches if s[0] is not token]
                set_attn_implementation(config, switches[-1][1] if switches else own)
                if not switches:
                    del _active[id(config)]


def own_attention(config: Any) -> str | None:
    """The attention implementation `config` has of its own, whatever switches are in force now."""
    with _lock:
        found = _active.get(id(config))
        return get_attn_implementation(config) if found is None else found[0]
