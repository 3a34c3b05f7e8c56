"""A tqdm bar of finished requests with tokens per second: generated ones, or a scoring run's scored prompts."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def progress_hook(engine, num_requests: int, *, enabled: bool, verb: str = "Generating", prompts: bool = False):
    """Yields an `on_step` callback for `Engine.run` (None when disabled). `prompts`: count the prompt tokens each
    finished request computed (a scoring run generates nothing), not the generated ones."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    start = time.perf_counter()
    tokens = 0
    with tqdm(total=num_requests, desc=f"{verb} {num_requests} requests", unit="req") as bar:

        def on_step(step) -> None:
            nonlocal tokens
            if prompts:
                tokens += sum(len(out.prompt_ids) - out.num_cached_tokens for out in step.finished)
            else:
                tokens += sum(len(t) for t in step.new_tokens.values())
            if step.finished:
                bar.update(len(step.finished))
            bar.set_postfix(tok_s=f"{tokens / max(time.perf_counter() - start, 1e-9):.0f}", refresh=False)

        yield on_step
