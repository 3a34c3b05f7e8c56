"""hf_paged as users install it: the wheel and the sdist hold what the code opens and nothing a used working tree
left behind, and the base install (no extras) works, with every optional part naming the extra it needs.

Every other test imports hf_paged from the checkout, so a file missing from the wheel (a model asset, an lm-eval
task) or an extra imported unguarded passes there and fails only for `pip install hf_paged`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# files a used working tree holds beside the tracked ones: bytecode, numba's on-disk cache, a build folder
STRAYS = ("hf_paged/assets/lm_eval_tasks/__pycache__/paged_tasks.cpython-311.pyc", "hf_paged/assets/tiny-lm/x.nbi",
          "hf_paged/cache/kernels/__pycache__/cpu_attention.f-1.py311.nbi", "tests/__pycache__/conftest.cpython-311.pyc")


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout (the tracked files are the reference)")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (REPO / p).is_file()]


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> tuple[Path, set[str]]:
    """A copy of the tracked files plus the strays of a used tree; returns it and the tracked package files."""
    tracked = _tracked()
    root = tmp_path_factory.mktemp("src")
    for path in tracked:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, root / path)
    for path in STRAYS:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(b"stray")
    return root, {p for p in tracked if p.startswith("hf_paged/")}


def test_wheel_holds_every_tracked_package_file_and_no_strays(source_tree, tmp_path):
    """The wheel's hf_paged/ is exactly the tracked hf_paged/ (assets included: the embedded model, the lm-eval
    tasks and their Python); a `__pycache__` or `.nbi` under assets was packed by the `assets/**/*` glob."""
    root, package = source_tree
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(root)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("hf_paged-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    packed = {n for n in names if n.startswith("hf_paged/")}
    assert sorted(package - packed) == [], "tracked files missing from the wheel"
    assert sorted(packed - package) == [], "files in the wheel that are not tracked"
    assert "hf-paged = hf_paged.cli:main" in entry_points


def test_sdist_holds_the_package_and_its_whole_test_suite(source_tree, tmp_path):
    """The sdist builds a wheel (pyproject, README, the package) and carries the tests it can run: conftest,
    helpers and the test folders, not only the `tests/test*.py` setuptools picks by default."""
    root, package = source_tree
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, timeout=300)
    (sdist,) = tmp_path.glob("hf_paged-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    tests = {p for p in _tracked() if p.startswith("tests/")}
    assert sorted((package | tests | {"pyproject.toml", "README.md"}) - names) == []
    assert sorted(p for p in STRAYS if p in names) == []


# Each extra's import names, and what a base install must say when one is missing.
EXTRAS = {"serve": ("fastapi", "starlette", "uvicorn", "prometheus_client"), "ray": ("ray",), "eval": ("lm_eval",),
          "triton": ("triton",)}
BLOCKER = """
import importlib.abc, sys
BLOCKED = set({blocked!r})
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
"""
PROBE = """
import contextlib, importlib, io, json
import hf_paged
from hf_paged import JSONSchemaLogitsProcessor
results = {}
def attempt(key, fn):
    try:
        fn()
        results[key] = "ok"
    except ImportError as exc:
        results[key] = "ImportError: " + str(exc)
def cli(key, argv):
    from hf_paged.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(argv)
    results[key] = f"{status} {err.getvalue()}"
model, tok = hf_paged.default_model()
hf_paged.wrap(model)
ids = tok(["A person: "], return_tensors="pt")
proc = JSONSchemaLogitsProcessor({"type": "object", "required": ["a"], "additionalProperties": False,
                                  "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}}, tok)
out = model.generate(**ids, logits_processor=[proc], max_new_tokens=32, do_sample=False)
results["json"] = json.loads(tok.decode(out[0, ids.input_ids.shape[1]:], skip_special_tokens=True))
attempt("serving.build_app", lambda: importlib.import_module("hf_paged.serving").build_app)
attempt("integrations.PagedLM", lambda: importlib.import_module("hf_paged.integrations").PagedLM)
attempt("integrations.lm_eval", lambda: importlib.import_module("hf_paged.integrations.lm_eval"))
attempt("scaleout.deploy", lambda: importlib.import_module("hf_paged.scaleout.deploy"))
attempt("scaleout.ray_router", lambda: importlib.import_module("hf_paged.scaleout.ray_router"))
cli("cli serve", ["serve"])
cli("cli replicas", ["serve", "--replicas", "2"])
cli("cli eval", ["eval", "--tasks", "hf_paged_gen", "--limit", "1"])
print("RESULTS " + json.dumps(results))
"""
NEEDS = {"serving.build_app": "serve", "integrations.PagedLM": "eval", "integrations.lm_eval": "eval",
         "scaleout.deploy": "ray", "scaleout.ray_router": "ray", "cli serve": "serve", "cli replicas": "ray",
         "cli eval": "eval"}


def test_base_install_works_and_each_missing_extra_is_named(tmp_path):
    """With no extra importable: wrap, generate and a JSON schema work; each documented entry point of an extra
    (Python or command line) raises an ImportError or exits 2 naming `pip install 'hf_paged[EXTRA]'`, never
    a bare `No module named 'ray'` or a traceback. Run outside the checkout, as an installed package would be."""
    blocked = sorted(name for names in EXTRAS.values() for name in names)
    code = BLOCKER.format(blocked=blocked) + PROBE
    env_path = str(REPO)  # (hf_paged from this checkout, the cwd elsewhere)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
                         env={**os.environ, "PYTHONPATH": env_path, "HF_PAGED_JIT": "off"})
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULTS "))
    results = json.loads(line.removeprefix("RESULTS "))
    assert isinstance(results.pop("json")["a"], int)
    for key, extra in NEEDS.items():
        message = results[key]
        assert f"pip install 'hf_paged[{extra}]'" in message, f"{key}: {message}"
        assert "Traceback" not in message, f"{key}: {message}"
        if key.startswith("cli"):
            assert message.startswith("2 "), f"{key}: {message}"
