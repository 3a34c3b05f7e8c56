"""A process forked while a program's calls ran (its state's worker thread and the calls' engine requests stay in the
parent; the child's engine drops the requests): a read of that state in the child waited for ever. It raises."""

from __future__ import annotations

import threading
from collections import deque

import pytest

from hf_paged.errors import RequestFailedError
from hf_paged.programs.state import ProgramState


def _state(busy: bool) -> ProgramState:
    state = ProgramState.__new__(ProgramState)  # (the fields the worker and the reads use; no engine needed)
    state._cond, state._busy, state._error = threading.Condition(), busy, None
    state._ops = deque(["queued text"]) if busy else deque()
    return state


def test_a_state_forked_mid_call_raises_at_its_next_read():
    state = _state(busy=True)
    state._after_fork_in_child()  # what os.fork runs in the child
    with pytest.raises(RequestFailedError, match="forked while the program's calls ran"):
        state.sync()


def test_an_idle_state_forked_reads_as_before():
    state = _state(busy=False)
    state._after_fork_in_child()
    assert state.sync() is state
