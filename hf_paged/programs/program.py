"""`@hp.program`: a Python function over a state, run in process on a wrapped model's engine, or against a running
`hf-paged serve` (`triage.run(hp.remote(url), tokenizer, ...)`, `http.py`).

    @hp.program
    def triage(s, ticket):
        s += "Ticket: " + ticket + "\\nIntent: " + hp.select("intent", ["billing", "other"]) + "\\n"
        if s["intent"] == "billing":
            s += "Reply: " + hp.gen("reply", max_tokens=24, stop="\\n")

    state = triage.run(model, tokenizer, ticket="...")            # state["intent"], state.text
    states = triage.run_batch(model, tokenizer, [{"ticket": t} for t in tickets])

`run_batch` runs each instance in its own thread; their calls (and their forks') join the engine's continuous
batch. A program that raises aborts its requests still in flight (their blocks go back to the pool) and drops its
pins before the error reaches the caller.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hf_paged.programs.backend import ProgramBackend, RunContext
from hf_paged.programs.connect import backend_for
from hf_paged.programs.state import ProgramState

__all__ = ["Program", "program"]


class Program:
    """A program function `fn(s, **arguments)`; run it with `run` or `run_batch`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"hp.program decorates a function fn(s, ...), got {type(fn).__name__}")
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"a program runs on a model: call {self.fn.__name__}.run(model, tokenizer, **arguments) or "
                        f"{self.fn.__name__}.run_batch(model, tokenizer, [arguments, ...])")

    def run(self, model, tokenizer=None, /, **arguments: Any) -> ProgramState:
        """Run the program once; returns its state when it and all its forks are done (its return value in
        `state.return_value`). `model`: a causal LM (wrapped with default settings when it is not wrapped yet),
        or `hp.remote(url)` to run against a running `hf-paged serve` (`http.py`); `tokenizer`: the model's."""
        return _run_one(self.fn, backend_for(model, tokenizer), arguments)

    def run_batch(self, model, tokenizer, arguments: Sequence[Mapping[str, Any]], /, *,
                  max_workers: int | None = None, raise_errors: bool = True) -> list[ProgramState | BaseException]:
        """Run one instance per mapping of arguments, all at once (threads; at most `max_workers`, default all up
        to 64), in one continuous batch. Returns their states in order. An instance that raised is aborted alone;
        with `raise_errors` (default) the first error is raised once all have ended, else its exception object
        takes its place in the list."""
        items = list(arguments)
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise TypeError(f"run_batch: arguments[{i}] is a {type(item).__name__}; give one mapping of keyword "
                                "arguments per instance, e.g. [{'ticket': t} for t in tickets]")
        if not items:
            return []
        if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)
                                        or max_workers < 1):
            raise ValueError(f"run_batch: max_workers must be an int >= 1, got {max_workers!r}")
        backend = backend_for(model, tokenizer)
        workers = max_workers or min(len(items), 64)
        with ThreadPoolExecutor(workers, thread_name_prefix="hf_paged-program") as pool:
            futures = [pool.submit(_run_one, self.fn, backend, dict(item)) for item in items]
        results: list[ProgramState | BaseException] = []
        for i, future in enumerate(futures):
            error = future.exception()
            if error is not None and raise_errors:
                error.add_note(f"(in run_batch instance {i}: {items[i]!r})")
                raise error
            results.append(error if error is not None else future.result())
        return results


def program(fn: Callable[..., Any]) -> Program:
    """Make `fn(s, **arguments)` a program (see the module docstring)."""
    return Program(fn)


def _run_one(fn: Callable[..., Any], backend: ProgramBackend, arguments: dict[str, Any]) -> ProgramState:
    run = RunContext(backend)
    state = ProgramState(run)
    try:
        state.return_value = fn(state, **arguments)
        state.join()
    except BaseException:
        run.abort()  # requests still in flight end now; their blocks go back to the pool
        state.join(raise_errors=False)
        raise
    finally:
        run.finished = True
        run.release()
    return state
