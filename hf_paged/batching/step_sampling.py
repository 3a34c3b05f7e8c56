"""`StepSampling`: from one step's logits to each request's new tokens (steps 6-7 of `Engine.step`).

The engine hands it the rows to sample once the forward ran and the scoring rows are split off. It expands each
request's row to its `n` forks (a fork samples its first token from its parent's row, right after it: stock's row
order for the draws), verifies speculating requests' drafts apart, samples the rest and appends the tokens
(`TokenAppender`); a row whose processor failed fails its request alone.
"""

from __future__ import annotations

import time

import torch

from hf_paged.batching.appending import TokenAppender
from hf_paged.batching.lifecycle import RequestLifecycle
from hf_paged.batching.metrics import EngineMetrics
from hf_paged.batching.request import Request, StepOutput
from hf_paged.batching.sampler import Sampler, SampleResult
from hf_paged.batching.speculative import DraftRows, Speculator
from hf_paged.batching.step_inputs import StepInputs


class StepSampling:
    """Samples and appends one step's tokens; owns no state beyond the engine's parts it is given."""

    def __init__(self, sampler: Sampler, speculator: Speculator, lifecycle: RequestLifecycle,
                 appender: TokenAppender, metrics: EngineMetrics):
        self.sampler, self.speculator, self.lifecycle = sampler, speculator, lifecycle
        self.appender, self.metrics = appender, metrics

    def sample(self, inputs: StepInputs, logits: torch.Tensor, result: StepOutput, *, greedy: bool) -> None:
        """`logits`: the sampled rows only (`inputs.sampled_requests`, drafts' rows included); `greedy`: they are
        already the certified head's tokens (`ModelRunner.greedy_tokens`)."""
        if greedy:
            self._emit(inputs.sampled_requests, SampleResult.plain(logits), result)
            return
        sampled, drafted = inputs.sampled_requests, None
        if any(inputs.num_draft_tokens):  # speculating decodes have 1 + k rows each: verified apart
            split = self.speculator.split(inputs, logits)
            sampled, logits, drafted = split.requests, split.logits, split.drafted
        samplers, row_of = [], []  # each request's forks right after it (stock's row order for the draws)
        for row, parent in enumerate(sampled):
            children = self.lifecycle.fork_children(parent)  # forks sample their first token from the parent's row
            samplers.extend([parent, *children])
            row_of.extend([row] * (1 + len(children)))
        if len(samplers) != len(sampled):
            logits = logits.index_select(0, torch.tensor(row_of, device=logits.device))
        if drafted is not None:
            self._verify(drafted, result)
        if not samplers:
            return
        with torch.inference_mode():  # the logits are inference tensors: processors may edit them in place
            self._emit(samplers, self.sampler(samplers, logits), result)

    def _emit(self, samplers: list[Request], sample: SampleResult, result: StepOutput) -> None:
        now = time.perf_counter()
        for request, token, failure, entry in zip(samplers, sample.token_ids, sample.errors, sample.logprobs):
            if failure is not None:
                self.lifecycle.fail(request, failure)
            else:
                self.appender.emit(request, [token], now, result, [entry])

    def _verify(self, drafted: DraftRows, result: StepOutput) -> None:
        """Keep each speculating request's accepted drafts and the model's next token; roll back the rest."""
        with torch.inference_mode():
            verdicts = self.speculator.verify(drafted, self.sampler)
        now = time.perf_counter()
        for request, verdict in zip(drafted.requests, verdicts):
            if verdict.error is not None:
                self.lifecycle.fail(request, verdict.error)
                continue
            self.speculator.settle(request, verdict)
            self.metrics.num_draft_tokens += verdict.num_drafted
            self.metrics.num_accepted_tokens += verdict.num_accepted
            self.appender.emit(request, verdict.token_ids, now, result, verdict.logprobs)
