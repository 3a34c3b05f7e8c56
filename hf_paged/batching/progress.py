"""A tqdm bar of finished requests with generated tokens per second."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def progress_hook(engine, num_requests: int, *, enabled: bool, verb: str = "Generating"):
    """Yields an `on_step` callback for `Engine.run` (None when disabled)."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    start = time.perf_counter()
    tokens = 0
    with tqdm(total=num_requests, desc=f"{verb} {num_requests} requests", unit="req") as bar:

        def on_step(step) -> None:
            nonlocal tokens
            tokens += sum(len(t) for t in step.new_tokens.values())
            if step.finished:
                bar.update(len(step.finished))
            bar.set_postfix(tok_s=f"{tokens / max(time.perf_counter() - start, 1e-9):.0f}", refresh=False)

        yield on_step
