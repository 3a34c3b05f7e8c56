"""Stopping criteria on the paged engine, called exactly as stock `generate`'s loop calls them (issue 44).

Stock `generate` advances every row one token per step and, after step k, calls its `StoppingCriteriaList` with
`input_ids` `[rows, padded prompt + k]`: each row's tokens, a row already finished padded with `pad_token_id`
when the list has an EOS criterion (else it keeps its real tokens, as stock keeps generating for it). Rows marked
done stop; the call returns when all are.

The engine runs rows at their own pace (chunked prefill, preemption), so `LockstepCriteria` replays that loop over
the engine's steps: step k is evaluated once every row still running has its k-th token, with the list stock
would build (`MaxLengthCriteria`, `MaxTimeCriteria`, `StopStringCriteria`, `EosTokenCriteria` and the caller's,
merged as stock merges them). A row marked done is aborted in the engine; one that had run ahead is cut back to
its k tokens (greedy rows do not depend on each other, so the result is stock's, token for token). The list is
called once per stock step, as stock calls it: its cost is the caller's criteria's. With `output_scores` and
`return_dict_in_generate` it gets stock's `scores` tuple too (one `[rows, vocab]` tensor per step, grown a step at a
time: what the call returns as `scores`, a finished row's entries -inf but at its pad); else `None`, as stock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hf_paged.batching.request import StepOutput
from hf_paged.errors import StoppingCriterionError


class LockstepCriteria:
    """Replays stock's stopping checks over the engine's steps for one `generate` call (see the module doc)."""

    def __init__(self, criteria, input_ids: torch.Tensor, order: Sequence[str], pad_token_id: int,
                 max_new_tokens: int, abort: Callable[[list[str]], None],
                 sync: Callable[[list[int | None]], list[int | None]] | None = None,
                 scores_vocab: int | None = None) -> None:
        self.criteria = criteria
        # tensor parallel: every rank takes the first rank's verdicts (`Sampler.sync`); a verdict that differs by rank
        # (`max_time` on each rank's clock, a criterion that raised on one rank) would stop one rank's engine a step
        # before another's, and their forwards' collectives would stop matching
        self.sync = sync
        self.prompt_len = input_ids.shape[1]
        # stock's input_ids, grown a column a step: [rows, padded prompt + max_new_tokens], viewed up to step k
        self.ids = torch.cat([input_ids, input_ids.new_full((input_ids.shape[0], max_new_tokens), pad_token_id)], 1)
        self.row_of = {rid: i for i, rid in enumerate(order)}
        self.order = list(order)
        self.pad = pad_token_id
        self.abort = abort
        # stock pads finished rows only when an EOS criterion is in the list; else they keep generating
        self.pads_finished = any(hasattr(c, "eos_token_id") for c in criteria)
        self.tokens: list[list[int]] = [[] for _ in order]
        self.ended = [False] * len(order)  # the engine ended the row (EOS, its length, or our abort)
        self.done_at: list[int | None] = [None] * len(order)  # the stock step after which the row is finished
        self.num_steps = 0  # stock steps replayed so far
        self.aborted: set[str] = set()
        # stock's `scores` argument: None, or (with `scores_vocab`, the width of a row) one [rows, vocab] per step
        self.scores: tuple[torch.Tensor, ...] | None = None if scores_vocab is None else ()
        self.row_scores: list[list[torch.Tensor]] = [[] for _ in order]
        if scores_vocab is not None:
            self.filler = torch.full((scores_vocab,), float("-inf"), device=input_ids.device)
            self.filler[pad_token_id] = 0.0

    @property
    def finished(self) -> bool:
        return all(d is not None for d in self.done_at)

    def on_step(self, step: StepOutput) -> None:
        for rid, new in step.new_tokens.items():
            self.tokens[self.row_of[rid]].extend(new)
        for rid, new in step.new_scores.items():
            self.row_scores[self.row_of[rid]].extend(new)
        for out in step.finished:
            self.ended[self.row_of[out.request_id]] = True
        while not self.finished and self._step_ready():
            self._run_step()

    def _step_ready(self) -> bool:
        """Every row stock would still extend has its next token (or the engine ended it)."""
        k = self.num_steps
        return all(len(t) > k or e for t, e, d in zip(self.tokens, self.ended, self.done_at)
                   if d is None or not self.pads_finished)

    def _run_step(self) -> None:
        k = self.num_steps
        column, rows = [], []
        for i, toks in enumerate(self.tokens):
            stopped = self.done_at[i] is not None and self.pads_finished
            column.append(self.pad if stopped or k >= len(toks) else toks[k])
            if self.scores is not None:
                mine = self.row_scores[i]
                rows.append(self.filler if stopped or k >= len(mine) else mine[k].to(self.filler.device))
        self.ids[:, self.prompt_len + k] = torch.tensor(column, dtype=self.ids.dtype)
        if self.scores is not None:
            self.scores += (torch.stack(rows),)
        self.num_steps = k + 1
        done, error = self._verdicts(k)
        if self.sync is not None:
            agreed = self.sync([None] * len(self.order) if error is not None else [int(d) for d in done])
            if agreed[0] is None:
                error = error or StoppingCriterionError(
                    "a stopping criterion raised on the first tensor-parallel rank; every rank ends this call")
            else:
                done, error = [bool(a) for a in agreed], None
        if error is not None:
            self.abort([rid for rid, e in zip(self.order, self.ended) if not e])
            raise error
        for i, is_done in enumerate(done):
            if is_done and self.done_at[i] is None:
                self.done_at[i] = k + 1
        # stock ends a finished row's engine work when it pads it; otherwise every row runs until all are done
        ids = [self.order[i] for i, d in enumerate(self.done_at) if d is not None and not self.ended[i]
               and self.order[i] not in self.aborted and (self.pads_finished or self.finished)]
        if ids:
            self.aborted.update(ids)
            self.abort(ids)

    def _verdicts(self, k: int) -> tuple[list[bool], StoppingCriterionError | None]:
        """Each row's verdict after stock step k, or the error that stops the call (raised by the caller)."""
        try:
            done = self.criteria(self.ids[:, : self.prompt_len + k + 1], self.scores)
        except Exception as exc:  # noqa: BLE001 -- the caller's code: name it, end only this call's requests
            names = ", ".join(type(c).__name__ for c in self.criteria)
            error = StoppingCriterionError(
                f"a stopping criterion ({names}) raised {type(exc).__name__}: {exc}; this generate call's requests "
                "were aborted, the engine's other requests go on")
            error.__cause__ = exc
            return [], error
        done = [bool(d) for d in torch.as_tensor(done).reshape(-1).tolist()]
        if len(done) == 1 and len(self.order) > 1:
            done = done * len(self.order)
        if len(done) != len(self.order):
            return [], StoppingCriterionError(
                f"the stopping criteria returned {len(done)} values for {len(self.order)} rows; return one bool per "
                "row of input_ids (or one for all)")
        return done, None

    def cut(self, row: int, tokens: list[int]) -> list[int]:
        """The row's tokens as stock returns them: up to its stop step (padding is added by the caller), or up to
        the last step when rows keep their real tokens."""
        if self.pads_finished and self.done_at[row] is not None:
            return tokens[: self.done_at[row]]
        return tokens[: self.num_steps]
