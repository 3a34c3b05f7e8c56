"""Scoring rows with alternatives: a scoring request (`SamplingParams.score_targets`) that also asks for `logprobs=k`
gets the k most likely tokens at each scored position (`RequestOutput.score_top_logprobs`), beside the targets'
own log-probabilities that `score_rows.record_scores` writes.

    scored rows of a step   S0 S0 S0 | T0 T0      (S asks for k = 2, T for none)
    S's rows -> one log_softmax -> top 2 per row -> request.score_top[target index]
    then record_scores(all rows)  (it consumes the logits in place: the alternatives are read first)
    S's targets' values are then taken from that same log_softmax: a target among its alternatives has the very
    same value in both (a client compares them to tell whether the target was the most likely token)

A recomputed chunk after a preemption writes the same values again, as `record_scores` does.
"""

from __future__ import annotations

import torch

from hf_paged.batching.logprobs import top_logprobs
from hf_paged.batching.score_rows import record_scores
from hf_paged.batching.step_inputs import ScoredRows

__all__ = ["record_scored_rows"]


def record_scored_rows(scored: list[ScoredRows], logits: torch.Tensor) -> None:
    """`logits`: `[sum of counts, vocab]`, the rows of `scored` in order (consumed, as by `record_scores`)."""
    index: list[int] = []
    ks: list[int] = []
    asking: list[ScoredRows] = []
    row = 0
    for rows in scored:
        if rows.request.params.logprobs:
            asking.append(rows)
            index.extend(range(row, row + rows.count))
            ks.extend([rows.request.params.logprobs] * rows.count)
        row += rows.count
    if asking:
        targets = [t for rows in asking for t in _targets(rows)]
        with torch.inference_mode():
            chosen = logits.index_select(0, torch.tensor(index, device=logits.device)).float()
            logprobs = torch.log_softmax(chosen, dim=-1)
            tops = top_logprobs(logprobs, ks)
            values = logprobs.gather(1, torch.tensor(targets, device=logits.device)[:, None]).squeeze(1).tolist()
    record_scores(scored, logits)
    at = 0
    for rows in asking:
        request = rows.request
        start = rows.first - request.score_start
        request.score_top[start : start + rows.count] = tops[at : at + rows.count]
        request.score_logprobs[start : start + rows.count] = values[at : at + rows.count]
        at += rows.count


def _targets(rows: ScoredRows) -> list[int]:
    start = rows.first - rows.request.score_start
    return rows.request.params.score_targets[start : start + rows.count]
