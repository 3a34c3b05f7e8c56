"""`--max-waiting` counts the sequences admitted but not yet in the engine loop's queue: requests arriving together
(admitted one after another on the event loop, each still tokenizing or waiting for a body) cannot all slip under the
bound, and what a request never queued stops counting when it closes. h87's mutation audit: the gate ignoring
`num_admitted` passed every test (they admit and queue one request at a time)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from hf_paged.serving.admission import AdmissionGate
from hf_paged.serving.errors import ApiError


def _gate(limit: int) -> AdmissionGate:
    return AdmissionGate(SimpleNamespace(num_waiting=0, is_alive=True), limit, retry_after_s=3)  # type: ignore[arg-type]


def test_requests_admitted_together_share_the_bound():
    gate = _gate(4)
    first = gate.admit(2, n=1)  # admitted, not queued yet: the loop's num_waiting is still 0
    second = gate.admit(1, n=2)  # 2 + 2 = 4: fits exactly
    with pytest.raises(ApiError) as refused:
        gate.admit(1)  # a fifth sequence while the first four are still on their way to the queue
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "3"}
    first.queued()  # one of its prompts entered the queue: counted by the loop from now on, not here
    assert gate.num_admitted == 3
    first.close(), second.close()  # the rest never queued (a client went away): nothing stays counted
    assert gate.num_admitted == 0
    gate.admit(4).close()  # the whole bound is free again
