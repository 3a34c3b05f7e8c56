"""A guard against benchmark rot: every `benchmarks/*.py` (and `benchmarks/routing/*.py`) imports on HEAD, and every
one with a command line answers `--help` from its own `main`.

The committed results in `benchmarks/*_results.md` back claims in the README and the issue notes; a refactor that
renames an import or a constant used by a parser breaks the script that reproduces them without any other test
noticing (session 19 found such crashes). Import and `--help` are cheap (no model is built, nothing is timed); they
run in one child process so that the scripts' module-level settings (`HF_PAGED_JIT`, `OMP_NUM_THREADS`, `sys.path`)
and imports of Ray / lm-eval stay out of the test process. A script without a parser (`main()` reads `sys.argv` by
hand or takes no arguments) is imported only: calling its `main` would run the benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
PATHS = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p.relative_to(ROOT)
         for p in [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("routing/*.py")]}  # module -> its file
MODULES = sorted(PATHS)

_CHILD = r"""
import contextlib, importlib, io, json, sys, traceback
results = {}
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
        main = getattr(module, "main", None)
        with open(module.__file__) as f:
            source = f.read()
        if main is None or "argparse" not in source:
            results[name] = {"ok": True, "help": None}
            continue
        sys.argv[:] = [module.__file__, "--help"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                main()
                code = "returned"
            except SystemExit as exit_:
                code = exit_.code
        results[name] = {"ok": code in (0, None) and "usage:" in out.getvalue(),
                         "help": out.getvalue()[:200], "exit": repr(code)}
    except BaseException:  # noqa: BLE001 -- every failure is the finding, reported per module
        results[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
print("@@RESULTS@@" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes() -> dict:
    # HF_PAGED_JIT=off: `benchmarks/common.py` asks for the compiled kernels at import (steady-state timing); a help
    # check needs none. The child's cwd is the repository root, as when a script is run as `python -m benchmarks.x`.
    env = {**os.environ, "HF_PAGED_JIT": "off", "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _CHILD, *MODULES], cwd=ROOT, env=env, capture_output=True, check=False,
                         text=True, timeout=300)
    marker = run.stdout.rfind("@@RESULTS@@")
    assert marker >= 0, f"the import child died (rc {run.returncode}):\n{run.stderr[-3000:]}"
    return json.loads(run.stdout[marker + len("@@RESULTS@@"):])


def test_the_benchmark_list_is_not_empty() -> None:
    assert len(MODULES) > 50 and "benchmarks.throughput" in MODULES and "benchmarks.routing.policies" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_a_benchmark_imports_and_answers_help(outcomes: dict, module: str) -> None:
    outcome = outcomes[module]
    assert outcome["ok"], outcome.get("error") or f"--help exited {outcome.get('exit')}: {outcome.get('help')!r}"


# Correctness reports whose elapsed time is incidental (no timing claim rests on it).
NOT_TIMINGS = {"benchmarks.json_schema_suite", "benchmarks.schema_coverage"}
CLOCKS = ("process_time", "perf_counter", "thread_time", "timed_generate_batch")  # (the last times with one)


def timing_scripts_without_a_machine(root: Path = ROOT) -> list[str]:
    """The benchmarks with a `main` that read a clock but never say what they ran on (`benchmarks.common.machine`,
    or `serve_common.describe`, which includes it): their numbers cannot be compared with a results file's."""
    missing = []
    for module in MODULES:
        source = (root / PATHS[module]).read_text()
        if module in NOT_TIMINGS or "def main(" not in source or not any(c in source for c in CLOCKS):
            continue
        if "machine()" not in source and "describe(" not in source:
            missing.append(module)
    return missing


def test_every_timing_benchmark_says_what_it_ran_on() -> None:
    assert timing_scripts_without_a_machine() == []
