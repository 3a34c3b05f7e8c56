"""What `wrap` leaves on a model, and `engine_of`: read by the patched `generate` without importing `wrapping`.

    model.__dict__["_hf_paged"] = _WrapState(config, saved methods, engine created at first use)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from hf_paged.config import PagedConfig

__all__ = ["engine_of", "is_wrapped"]

_STATE_ATTR = "_hf_paged"
_MISSING = object()
_ENGINE_LOCK = threading.Lock()


@dataclass(slots=True)
class _WrapState:
    config: PagedConfig
    saved: dict[str, Any]  # instance attributes we replaced (absent ones map to _MISSING)
    engine: Any = None  # created at first use


def is_wrapped(model: torch.nn.Module) -> bool:
    return _STATE_ATTR in model.__dict__


def engine_of(model: torch.nn.Module):
    """The `Engine` behind a wrapped model (created at first use)."""
    state: _WrapState | None = model.__dict__.get(_STATE_ATTR)
    if state is None:
        raise ValueError("model is not wrapped: call hf_paged.wrap(model) first")
    if state.engine is None:
        from hf_paged.batching.engine import Engine
        from hf_paged.distributed.tensor_parallel import engine_config, token_sync

        with _ENGINE_LOCK:  # threads calling generate at once must share one engine
            if state.engine is None:  # tensor parallel: every rank agrees on the pool size here
                engine = Engine(model, engine_config(model, state.config))
                engine.sampler.sync = token_sync(model)  # tensor parallel: every rank takes the first's draws
                engine.speculator.needs_seed = engine.sampler.sync is not None
                state.engine = engine
    return state.engine
