"""Helpers shared by the benchmark scripts: machine description, timing, table printing."""

from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager

import torch

# Steady state: the compiled kernels (the processors' and the CPU attention's) load before anything is timed, instead
# of in the background while the first requests run on the Python and torch paths (`hf_paged.processors.jit`,
# `hf_paged.cache.kernels.cpu_warm`); servers started by a benchmark inherit it. A benchmark of first-request
# latency sets HF_PAGED_JIT itself.
os.environ.setdefault("HF_PAGED_JIT", "now")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads){gpu}, "
            f"python {platform.python_version()}")


@contextmanager
def timed(results: dict, key: str):
    start = time.perf_counter()
    yield
    results[key] = time.perf_counter() - start


def print_table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    cells = [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = []
    if title:
        lines.append(title)
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    text = "\n".join(lines)
    print(text)
    return text
