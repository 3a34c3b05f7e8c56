"""A request's path through the code (issue 38's measure of a layout that shows the design): from `generate_batch`
through a step and back, no file is entered more than twice along any chain of calls (no ping-pong between two
modules, e.g. the engine calling a helper that calls back into the engine that calls the helper again)."""

from __future__ import annotations

import collections
import sys
import threading
from pathlib import Path

from transformers import GenerationConfig

import hf_paged
from hf_paged import PagedConfig
from hf_paged.batching.engine_loop import EngineLoop
from tests.tiny_models import tiny_model

ROOT = str(Path(hf_paged.__file__).resolve().parent)
# The wrapper `interrupts.critical` puts around a function only forwards the call (a SIGINT held meanwhile): it is
# the decorated function's frame, not a visit to interrupts.py (the same code object serves every decorated function)
WRAPPERS = {EngineLoop._turn.__code__}


def _chain(frame) -> list[str]:
    """hf_paged files on the call stack, innermost first, a run of frames in one file counted once."""
    files: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if frame.f_code in WRAPPERS:
            frame = frame.f_back
            continue
        if name.startswith(ROOT) and (not files or files[-1] != name):
            files.append(name)
        frame = frame.f_back
    return files


def test_no_file_is_entered_more_than_twice_along_a_call_chain():
    model = hf_paged.wrap(tiny_model("llama"), PagedConfig(block_size=8, num_blocks=64))
    config = GenerationConfig(max_new_tokens=3, do_sample=False)
    hf_paged.engine_of(model)  # the engine is built before the trace; its loop thread starts inside it (traced)
    worst: dict[str, tuple[int, list[str]]] = {}

    def tracer(frame, event, arg):  # returns None: no line tracing, the calls are enough
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            chain = _chain(frame)
            for name, count in collections.Counter(chain).items():
                if count > worst.get(name, (0, []))[0]:
                    worst[name] = (count, chain)

    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        model.generate_batch([[1, 2, 3, 4, 5, 6, 7, 8, 9]], config)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    seen = {Path(name).name for name in worst}
    assert {"engine.py", "scheduler.py", "attention.py", "block_pool.py", "sampler.py"} <= seen  # a whole step
    over = {Path(name).relative_to(ROOT).as_posix(): " -> ".join(Path(f).name for f in reversed(chain))
            for name, (count, chain) in worst.items() if count > 2}
    assert over == {}
