"""Every gpu-marked test runs in `scripts/gpu_check.sh`, the one command a GPU lease runs: a CUDA test outside its
pytest paths would never run anywhere (CI has no GPU; the default run deselects `gpu`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pytest_paths() -> list[str]:
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    paths = re.search(r"^GPU_TEST_PATHS=\((.*?)\)$", script, re.MULTILINE)
    assert paths and '"${GPU_TEST_PATHS[@]}"' in script, "scripts/gpu_check.sh no longer lists GPU_TEST_PATHS"
    return paths.group(1).split()


def test_every_gpu_marked_test_file_is_in_the_gpu_check():
    paths = _pytest_paths()
    assert paths and all((ROOT / p).exists() for p in paths), paths
    marked = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py")
                    if f != Path(__file__) and "pytest.mark.gpu" in f.read_text())
    missing = [f for f in marked if not any(f == p or f.startswith(p.rstrip("/") + "/") for p in paths)]
    assert marked and not missing, f"gpu-marked tests that scripts/gpu_check.sh does not run: {missing}"
