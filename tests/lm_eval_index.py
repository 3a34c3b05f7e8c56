"""lm-eval's index of its own tasks, built once per test session instead of once per `TaskManager`.

Every `TaskManager()` parses lm-eval's ~14,000 bundled task YAML files (8-13 s on a 2-core machine; 38 s under a
profiler), and the lm-eval tests build about fifteen of them in one run. The bundled files do not change while the
tests run, so the index of that one folder is built the first time and each later build gets a fresh copy of it
(unpickled: ~0.6 s, and no caller can change what the next one sees); any other folder (our `include_path` task
folders, a test's own tmp_path) is built as lm-eval builds it, and merged in lm-eval's order (later paths win).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def build_bundled_once(task_index: type) -> Callable[[], None]:
    """Patch `task_index.build` (lm_eval.tasks._index.TaskIndex); returns the function that undoes it."""
    original = task_index.__dict__["build"]  # the staticmethod object itself, to put back as it was
    build = original.__func__
    bundled = Path(__import__("lm_eval.tasks", fromlist=["_index"]).__file__).parent.resolve()
    pickled: dict[bool, bytes] = {}
    log = logging.getLogger(task_index.__module__)

    def build_once(paths: Iterable[Path], *, resolve_includes: bool = True) -> dict[str, Any]:
        index: dict[str, Any] = {}
        for root in paths:
            if Path(root).resolve() != bundled:
                part = build([root], resolve_includes=resolve_includes)
            else:
                if resolve_includes not in pickled:
                    pickled[resolve_includes] = pickle.dumps(build([root], resolve_includes=resolve_includes))
                part = pickle.loads(pickled[resolve_includes])
            for name, entry in part.items():  # lm-eval's merge: later paths overwrite earlier, with its warning
                if name in index:
                    log.warning("Task '%s' from %s overrides existing task from %s", name, entry.yaml_path,
                                index[name].yaml_path)
                index[name] = entry
        return index

    task_index.build = staticmethod(build_once)

    def undo() -> None:
        task_index.build = original

    return undo
