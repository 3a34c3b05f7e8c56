"""What `wrap` leaves on a model, and `engine_of`: read by the patched `generate` without importing `wrapping`.

    model.__dict__["_hf_paged"] = _WrapState(config, saved methods, engine created at first use)
"""

from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from hf_paged.config import PagedConfig

__all__ = ["engine_of", "is_wrapped"]

_STATE_ATTR = "_hf_paged"
_MISSING = object()
_ENGINE_LOCK = threading.Lock()


def _fresh_lock_after_fork() -> None:
    """A child forked while another thread of the parent built an engine would wait for ever on the lock that thread
    held (it does not exist in the child): the child starts with a free one. (A `with` in the forking thread itself
    releases the object it took: the old one.)"""
    global _ENGINE_LOCK
    _ENGINE_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


@dataclass(slots=True)
class _WrapState:
    config: PagedConfig
    saved: dict[str, Any]  # instance attributes we replaced (absent ones map to _MISSING)
    engine: Any = None  # created at first use

    def __deepcopy__(self, memo: dict) -> _WrapState:
        """A deep copy of a wrapped model (a reference model, an EMA copy) is wrapped alike, with an engine of its
        own made at its first use (an engine holds threads and locks: it is not copied)."""
        saved = {k: v if v is _MISSING else copy.deepcopy(v, memo) for k, v in self.saved.items()}
        return _WrapState(self.config, saved)

    def __reduce__(self):
        raise TypeError(
            "a model wrapped by hf_paged cannot be pickled (torch.save(model), pickle): its patched methods would not "
            "load. Save its weights instead (model.save_pretrained(path) or torch.save(model.state_dict(), f)), or "
            "call hf_paged.unwrap(model) first and wrap the loaded model again"
        )


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
