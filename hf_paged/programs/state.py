"""`ProgramState`, the `s` a program writes to: `s += text`, `s += hp.gen(...)`, `s["name"]`, `s.text`,
`s.fork(n)`.

Appending is asynchronous: `s += ...` queues the parts and returns; a worker thread of the state runs them in
order, each call joining the engine's continuous batch. Reading (`s[name]`, `s.text`, `s.fork`) waits for the
queue. So forks written one after another in a loop run together:

    for f in s.fork(2):                       # two states sharing s's prefix blocks (through the prefix cache)
        f += "Option: " + hp.gen("option")    # queued on each fork; both requests run in the same engine steps
    s["option"]                               # waits for both: ["...", "..."] (a field of forks, as a list)

A call that fails is raised by the next read of that state (or when the program returns). A wait on several states
(the program's end, a read of a field its forks write) raises the first failure of any of them as soon as it
happens; the program then raises, and `Program.run` aborts the requests of the others.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any, Self

from hf_paged.after_fork import call_after_fork
from hf_paged.errors import RequestFailedError
from hf_paged.programs.backend import RunContext
from hf_paged.programs.calls import GenCall, SelectCall, parts_of
from hf_paged.programs.errors import FieldConstraintError
from hf_paged.programs.steps import run_gen, run_select
from hf_paged.programs.track import CallRecord, TokenCounts, Track

__all__ = ["ForkGroup", "ProgramState"]


class ForkGroup(list):
    """The states made by one `fork(n)`, in order."""

    def join(self) -> ForkGroup:
        """Wait for every fork's queued calls (and their forks'); raises the first error as soon as a call fails."""
        if self:
            _wait([tree for state in self for tree in state._tree()], raise_errors=True)
        return self


class ProgramState:
    """The state of one running program (see the module docstring). Not made by hand: `Program.run` makes it."""

    def __init__(self, run: RunContext, track: Track | None = None) -> None:
        self._run = run
        self._track = run.new_track(track)
        self._ops: deque[str | GenCall | SelectCall] = deque()
        self._cond = threading.Condition()
        self._busy = False  # a worker thread is running the queue
        self._error: BaseException | None = None
        self._fork_groups: list[ForkGroup] = []
        self._names: set[str] = set()  # fields this state's own calls write (not those copied from its parent)
        self.return_value: Any = None  # what the program function returned
        _LIVE.add(self)

    # -- writing ---------------------------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> Self:
        parts = parts_of(other)
        with self._cond:
            self._raise_error()
            self._claim_names(parts)
            if not self._busy and all(isinstance(p, str) for p in parts):
                for part in parts:  # text alone, nothing queued: append it now
                    self._track.append_text(part)
                return self
            self._run.check_open()
            self._ops.extend(parts)
            if not self._busy:
                self._busy = True
                threading.Thread(target=self._drain, name="hf_paged-program-state", daemon=True).start()
        return self

    def _claim_names(self, parts: tuple) -> None:
        """Refuse a field name this state's own calls already write: the second value would silently replace the
        first. (A fork may reuse a name it copied from its parent, and a parent one its forks write: `s[name]` reads
        the state's own field first, then its forks'.)"""
        calls = [part for part in parts if isinstance(part, GenCall | SelectCall)]
        for i, call in enumerate(calls):
            if call.name in self._names or any(c.name == call.name for c in calls[:i]):
                kind = "hp.gen" if isinstance(call, GenCall) else "hp.select"
                raise FieldConstraintError(
                    f"{kind}({call.name!r}): this state already has a call writing field {call.name!r}; a second one "
                    f"would silently replace its value in s[{call.name!r}]: give each call its own name (e.g. "
                    f"f\"{call.name}_{{i}}\" in a loop)")
        self._names.update(c.name for c in calls)

    def fork(self, n: int = 2) -> ForkGroup:
        """`n` states continuing from this one's text; they share its prefix blocks through the prefix cache (this
        state keeps them pinned) and run their calls in the same engine steps. A field written by the forks reads
        from this state as the list of their values (`s["option"]`)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"fork(n) needs an int n >= 1 (the number of branches), got {n!r}")
        self.sync()
        group = ForkGroup(ProgramState(self._run, self._track.copy()) for _ in range(n))
        self._fork_groups.append(group)
        return group

    # -- reading ---------------------------------------------------------------------------------------------
    def sync(self) -> ProgramState:
        """Wait for this state's queued calls; raises the error of one that failed."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._raise_error()
        return self

    def __getitem__(self, name: str) -> Any:
        self.sync()
        if name in self._track.fields:
            return self._track.fields[name]
        for group in reversed(self._fork_groups):  # the latest forks that wrote the field (at any depth: a fork's
            group.join()  # forks answer for it, as a list per fork)
            values = [state.get(name, _MISSING) for state in group]
            if any(v is not _MISSING for v in values):
                return [None if v is _MISSING else v for v in values]
        raise KeyError(f"no field {name!r} in this program state; fields so far: {sorted(self._all_names())} "
                       "(its forks' included)")

    def _all_names(self) -> set[str]:
        names = set(self.fields)
        for group in self._fork_groups:
            group.join()
            for state in group:
                names |= state._all_names()
        return names

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: str) -> bool:
        return self.get(name, _MISSING) is not _MISSING

    @property
    def text(self) -> str:
        """Everything appended so far: literal text and field values, exactly."""
        return self.sync()._track.text

    @property
    def fields(self) -> dict[str, Any]:
        """This state's fields by name (not its forks')."""
        return dict(self.sync()._track.fields)

    @property
    def token_ids(self) -> list[int]:
        """The tokens of the text up to the last call (text appended since is not tokenized yet)."""
        return list(self.sync()._track.ids)

    @property
    def calls(self) -> list[CallRecord]:
        """One record per `gen` / `select` of this state, in order (value, finish reason, attempts, tokens)."""
        return list(self.sync()._track.calls)

    @property
    def forks(self) -> list[ProgramState]:
        return [state for group in self._fork_groups for state in group]

    def tokens(self) -> TokenCounts:
        """Tokens of every call of this state and its forks (prefilled, from cache, generated, forced)."""
        total = self.sync()._track.totals()
        for state in self.forks:
            total.add(state.tokens())
        return total

    def join(self, *, raise_errors: bool = True) -> ProgramState:
        """Wait for this state and all its forks (at any depth). Raises the first error as soon as any of them fails,
        without waiting for the others (they run on: a program that does not catch it is aborted, and with it
        their requests); `raise_errors=False` waits for all."""
        _wait(self._tree(), raise_errors=raise_errors)
        return self

    def _tree(self) -> list[ProgramState]:
        """This state and its forks, at any depth, in order."""
        return [self, *(state for fork in self.forks for state in fork._tree())]

    def __repr__(self) -> str:
        with self._cond:
            state = "running" if self._busy else "idle"
            return f"ProgramState({state}, fields={sorted(self._track.fields)}, text={self._track.text[-40:]!r})"

    # -- the worker ------------------------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        """A child forked while this state's worker ran: the worker and the engine requests of its calls stay in the
        parent (the child's engine drops them), so a read here waited for ever. It raises instead."""
        self._cond = threading.Condition()
        if self._busy:
            self._busy, self._ops = False, deque()
            self._error = RequestFailedError(
                "this process was forked while the program's calls ran; they belong to the parent process: run the "
                "program again in the child")

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _notify_run(self) -> None:
        with self._run.settled:  # (after this state's own lock is released: `_wait` reads it under this one)
            self._run.settled.notify_all()

    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._ops:
                    self._busy = False
                    self._cond.notify_all()
                    break
                op = self._ops.popleft()
            try:
                if isinstance(op, str):
                    self._track.append_text(op)
                elif isinstance(op, GenCall):
                    run_gen(self._run, self._track, op)
                else:
                    run_select(self._run, self._track, op)
            except BaseException as exc:  # noqa: BLE001 -- raised by the program's next read of this state
                with self._cond:
                    self._error = exc
                    self._ops.clear()
                    self._busy = False
                    self._cond.notify_all()
                self._notify_run()
                return
        self._notify_run()


def _wait(states: list[ProgramState], *, raise_errors: bool) -> None:
    """Wait until every state in `states` (one run's) is idle, or with `raise_errors` until one has failed: then
    raise the first error in order."""
    settled = states[0]._run.settled
    with settled:
        while True:
            failed = [state._error for state in states if state._error is not None]
            if failed and raise_errors:
                raise failed[0]
            if not any(state._busy for state in states):
                return
            settled.wait()


_MISSING = object()


_LIVE: weakref.WeakSet[ProgramState] = weakref.WeakSet()  # every state of this process (`_after_fork_in_child`)
call_after_fork(_LIVE, "_after_fork_in_child")
