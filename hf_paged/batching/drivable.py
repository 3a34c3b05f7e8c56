"""`Drivable`: what `EngineLoop` needs of an engine, declared (`batching.engine.Engine` is one), so the loop does not
import the engine that creates it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from hf_paged.batching.request import Request, RequestOutput, StepOutput
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import RequestFailedError

__all__ = ["Drivable"]


class Drivable(Protocol):
    """What the loop needs of an engine (`batching.engine.Engine` is one)."""

    lock: threading.RLock  # held by every call that changes requests or the pool, and by every step
    requests: Mapping[str, Request]

    @property
    def has_unfinished(self) -> bool: ...
    @property
    def num_waiting(self) -> int: ...
    def reserve_request_id(self, request_id: str | None = None) -> str: ...
    def release_request_ids(self, request_ids: Iterable[str]) -> None: ...
    def add_reserved_request(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams,
                             priority: int = 0, *, arrival_time: float | None = None) -> str: ...
    def abort(self, request_id: str, *, error: str | None = None,
              error_type: type[BaseException] = RequestFailedError) -> None: ...
    def step(self) -> StepOutput: ...
    def take_ended(self) -> list[RequestOutput]: ...
    def forget(self, request_id: str) -> None: ...
    def add_step_listener(self, listener: Callable[[StepOutput], None]) -> None: ...
