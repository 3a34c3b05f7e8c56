"""`TokenAppender`: a step's new tokens into their requests, the tokens a constraint forces after them
(jump-forward), and the stop checks that end requests.

    sampled / verified tokens -> append one by one (stop check after each: EOS, stop string, length)
                              -> still running and no scores to record? jump-forward: the first constraint's forced
                                 tokens (one allowed continuation each) appended the same way, computed by the next
                                 forward as one chunk instead of one decode step each
    a request with `logprobs` gets each token's entry beside it (`request.logprobs`, the step's `new_logprobs`),
    cut with its tokens; it takes no jump-forward (forced tokens have no row of logits to read them from)
"""

from __future__ import annotations

from collections.abc import Sequence

from hf_paged.batching.lifecycle import RequestLifecycle
from hf_paged.batching.logprobs import TokenLogprobs
from hf_paged.batching.metrics import EngineMetrics
from hf_paged.batching.request import Failure, Request, StepOutput
from hf_paged.batching.stopping import check_stop

__all__ = ["TokenAppender"]


class TokenAppender:
    """Appends tokens to requests, counting them and ending the requests they stop."""

    def __init__(self, lifecycle: RequestLifecycle, metrics: EngineMetrics, max_model_len: int) -> None:
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.max_model_len = max_model_len

    def emit(self, request: Request, tokens: list[int], now: float, result: StepOutput,
             logprobs: Sequence[TokenLogprobs | None] | None = None) -> None:
        """The tokens a step produced for `request` (with their `logprobs` entries when it asks), then the tokens
        its constraint forces after them."""
        self.append(request, tokens, now, result, logprobs, recorded=True)
        if not request.ended and not request.params.output_scores and request.params.logprobs is None:
            self.jump_forward(request, now, result)

    def append(self, request: Request, tokens: list[int], now: float, result: StepOutput,
               logprobs: Sequence[TokenLogprobs | None] | None = None, recorded: bool = False) -> None:
        """`recorded`: each of `tokens` has its scores / logits recorded (`output_scores` / `output_logits`), and
        those of tokens after a stop (speculative drafts verified past an EOS) are dropped with them."""
        streams = not request.params.max_retries  # a request that may rerun shows its tokens once it has ended
        rid = request.request_id
        for at, token in enumerate(tokens):
            request.output_ids.append(token)
            if request.params.record_timestamps:
                request.timestamps.append(now)
            entry = logprobs[at] if logprobs is not None else None
            if entry is not None:
                request.logprobs.append(entry)
            if streams:
                result.new_tokens.setdefault(rid, []).append(token)
                if entry is not None:
                    result.new_logprobs.setdefault(rid, []).append(entry)
                if request.params.output_scores and len(request.scores) >= len(request.output_ids):
                    result.new_scores.setdefault(rid, []).append(request.scores[len(request.output_ids) - 1])
            self.metrics.num_generated_tokens += 1
            if request.first_token_time is None:
                request.first_token_time = now
                self.metrics.time_to_first_token.append(now - request.arrival_time)
            request.last_token_time = now
            try:
                reason = check_stop(request, self.max_model_len)
            except Exception as exc:  # noqa: BLE001 -- its tokenizer's decode failed: this request fails alone
                self.lifecycle.fail(request, Failure.of(exc, "stop-string check failed"))
                return
            if reason is not None:
                unused = len(tokens) - at - 1
                if recorded and unused:
                    for records, kept in ((request.scores, request.params.output_scores),
                                          (request.logits, request.params.output_logits)):
                        if kept:
                            del records[len(records) - unused:]
                self.lifecycle.finish(request, reason)
                if not streams and request.finish_reason != "retry":
                    result.new_tokens[rid] = list(request.output_ids)
                    if request.params.logprobs is not None:
                        result.new_logprobs[rid] = list(request.logprobs)
                return

    def jump_forward(self, request: Request, now: float, result: StepOutput) -> None:
        """Append the tokens the request's first constraint forces (exactly one allowed continuation each): the
        output is what decoding would have given."""
        budget = request.params.max_new_tokens - len(request.output_ids)
        constraints = request.processors.constraints
        if len(constraints) != 1 or request.processors.row_processors or budget <= 0:
            return  # (another processor may ban the one token the constraint allows: a step decides, as in stock;
            # appended unchecked, bad_words_ids' banned token entered the output: h9)
        try:
            tokens = constraints[0].forced_tokens(request.request_id, request.output_ids, budget)
        except Exception:  # noqa: BLE001
            return  # the next step's processing reports the error on this request
        if tokens:
            request.num_forced_tokens += len(tokens)
            self.metrics.num_forced_tokens += len(tokens)
            self.append(request, list(tokens), now, result)
