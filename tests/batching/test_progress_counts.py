"""The progress bar's tokens per second counts a run's work: generated tokens, or a scoring run's computed prompt
tokens (a scoring request generates nothing: its bar read `tok_s=0` throughout)."""

from __future__ import annotations

import io

import tqdm.auto

from hf_paged.batching.progress import progress_hook
from hf_paged.batching.request import RequestOutput, RequestStatus, StepOutput

_INIT = tqdm.auto.tqdm.__init__


def _bar_text(monkeypatch, prompts: bool, step: StepOutput) -> str:
    stream = io.StringIO()
    monkeypatch.setattr(tqdm.auto.tqdm, "__init__",
                        lambda self, *a, **k: _INIT(self, *a, **{**k, "file": stream, "mininterval": 0}))
    with progress_hook(None, 1, enabled=True, verb="Scoring", prompts=prompts) as on_step:
        on_step(step)
    return stream.getvalue()


def test_a_scoring_bar_counts_the_prompt_tokens_computed(monkeypatch):
    scored = RequestOutput("req_0", list(range(40)), [], RequestStatus.FINISHED, finish_reason="scored",
                           num_cached_tokens=16)
    step = StepOutput(finished=[scored])
    assert "tok_s=0" in _bar_text(monkeypatch, False, step)  # (what the generation count reads for it)
    text = _bar_text(monkeypatch, True, step)
    assert "tok_s=" in text and "tok_s=0" not in text
