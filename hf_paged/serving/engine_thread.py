"""`engine_in_own_thread`: load a model and build its engine in a new thread that then becomes the engine loop's
thread, so every torch op runs in one thread. A second thread with its own torch (OpenMP) team made steps ~1.5x
slower on a 2-core CPU; the HTTP side does no torch work. `hf-paged serve` and each Ray replica start this way."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from hf_paged.batching.engine import Engine
from hf_paged.config import PagedConfig

__all__ = ["engine_in_own_thread"]


def engine_in_own_thread(load: Callable[[], tuple[Any, Any]], config: PagedConfig) -> tuple[Engine, Any]:
    """`load()` -> (model, tokenizer) and `Engine(model, config)` in the new thread, which then runs the loop until
    its shutdown. Returns (engine, tokenizer) once the loop is ready; re-raises what loading raised."""
    ready: queue.SimpleQueue = queue.SimpleQueue()

    def engine_thread() -> None:
        try:
            model, tokenizer = load()
            engine = Engine(model, config)
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread, which re-raises it
            ready.put(exc)
            return
        engine.loop.run_in_this_thread(on_ready=lambda: ready.put((engine, tokenizer)))

    threading.Thread(target=engine_thread, name="hf_paged-engine-loop", daemon=True).start()
    item = ready.get()
    if isinstance(item, BaseException):
        raise item
    return item
