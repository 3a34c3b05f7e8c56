"""`Request`: one prompt's journey through the engine, and `RequestOutput`, what the caller gets back."""

from __future__ import annotations

import enum
import math
import operator
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from hf_paged.batching.constraint_protocol import RequestProcessors
from hf_paged.batching.logprobs import TokenLogprobs, TopLogprob
from hf_paged.batching.request_ids import FORK_MARK as _FORK_MARK
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import RequestFailedError

# the finish reasons of a constrained document that will not parse: cut by max_new_tokens, or ended by EOS after its
# constraint gave up on it (a token it refused was forced, or the vocabulary cannot spell what it allows next)
INCOMPLETE = ("length_incomplete", "stop_incomplete")


def fork_ids(request_id: str, num_sequences: int) -> list[str]:
    """Ids of a request and its forks (`num_return_sequences`), parent first, as transformers names them."""
    return [request_id] + [f"{request_id}{_FORK_MARK}{k}" for k in range(num_sequences - 1)]


def fork_parent(request_id: str) -> str:
    """The id of the request a fork id was made from (`fork_ids`); a parent's own id for a parent."""
    return request_id.split(_FORK_MARK, 1)[0]


class RequestStatus(enum.IntEnum):
    """Life cycle: WAITING -> RUNNING <-> PREEMPTED -> FINISHED | FAILED (terminal states compare highest)."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    FAILED = 4

    @property
    def ended(self) -> bool:
        return self >= RequestStatus.FINISHED

    is_finished = ended  # the public enum's earlier name

    def __str__(self) -> str:  # `print(output.status)` says FINISHED, not the int 3
        return self.name

    def __repr__(self) -> str:  # a RequestOutput's repr shows `status=RequestStatus.FINISHED`
        return f"{type(self).__name__}.{self.name}"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a request failed: the message its output shows, and the class of the exception behind it (carried to
    `RequestOutput.error_type`; `generate` raises it when it is one of `hf_paged.errors`)."""

    message: str
    error_type: type[BaseException] = RequestFailedError  # no exception behind it (an abort, a lost request)

    @classmethod
    def of(cls, exc: BaseException, context: str) -> Failure:
        """`"<context>: <ExceptionClass>: <exc>"`, of `type(exc)`."""
        return cls(f"{context}: {type(exc).__name__}: {exc}", type(exc))


@dataclass(slots=True)
class RetryAttempt:
    """One run of a request with `max_retries` (`RequestOutput.attempts`, in order; the last is the output)."""

    finish_reason: str  # as `RequestOutput.finish_reason`
    generated_tokens: list[int]  # the attempt's tokens
    num_cached_tokens: int  # prompt tokens it found in the prefix cache
    seed: int | None  # the seed its draws used (attempt k > 0: derived from the request's seed and k)
    valid: bool | None  # the validator's verdict; None when it was not asked (cut short, failed, aborted)

    @property
    def num_tokens(self) -> int:
        return len(self.generated_tokens)


@dataclass(slots=True, eq=False)
class Request:
    """Engine-side state of one sequence.

        prompt_ids + output_ids = all tokens
        |---- num_computed_tokens (K/V in the cache) ----|-- still to compute --|
        When num_computed_tokens == len(all tokens), the next forward samples a new token.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int = 0  # higher runs first
    arrival_index: int = 0  # FCFS tie-break among equal priorities
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (first admission)
    finish_reason: str | None = None  # "stop" (EOS / stop string), "length", "abort", "error"
    error: str | None = None
    error_type: type[BaseException] | None = None  # the class of the exception behind `error`
    # this request's own random generator, made at its first draw on the logits' device (`generator_on`)
    generator: torch.Generator | None = None
    scores: list[torch.Tensor] = field(default_factory=list)  # processed scores per step (output_scores)
    logits: list[torch.Tensor] = field(default_factory=list)  # raw logits per step (output_logits)
    timestamps: list[float] = field(default_factory=list)  # params.record_timestamps: perf_counter per token
    swapped: Any = None  # CPU copy of the K/V while swapped out
    parent_id: str | None = None  # set on forked children (num_return_sequences)
    fork_index: int = 0  # 0: the request itself; k: its k-th fork (`fork_ids` order), for draw order and seeds
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    scheduled_time: float | None = None  # first admitted to a step (arrival -> here: its time in the queue)
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    num_forced_tokens: int = 0  # tokens appended by jump-forward (no sampling step of their own)
    prompt_digests: list[bytes] | None = None  # prefix-cache digests of the prompt's full blocks (computed once)
    prefix_end: Any = None  # where its last walk of the prefix cache stopped (the next one starts there)
    # speculative decoding: tokens drafted for the next step (after the last token, not yet verified); the
    # scheduler may trim them to its budget. `draft_probs` [k, vocab]: the distribution each was drawn from
    # (None: a deterministic proposal, as prompt lookup's)
    draft_ids: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None
    num_draft_tokens: int = 0  # drafted tokens verified by the model, over the request's life
    num_accepted_tokens: int = 0  # of which accepted
    num_masks_computed: int = 0  # sampled rows whose constraint mask was computed (resample: rejected draws only)
    attempts: list[RetryAttempt] = field(default_factory=list)  # max_retries: the runs so far (retry.py)
    seed: int | None = None  # a fork's or a retry's own seed (None: the request's own `params.seed`)
    resample_checks: list[Any] | None = None  # constraint_mode="resample": the constraints asked per token ([]:
    # masked as usual); None until its first sampled row (constraint_modes.resample_checks)
    # scoring (params.score_targets): each target's log-probability and whether it was the argmax, by index
    score_logprobs: list[float] | None = None
    score_greedy: list[bool] | None = None
    score_top: list[list[TopLogprob]] | None = None  # scoring with params.logprobs >= 1: each position's top k
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # params.logprobs: one per output token
    # params.logits_processors sorted once into constraints and stock row processors (constraint_protocol.py)
    processors: RequestProcessors = field(init=False)

    def __post_init__(self) -> None:
        self.processors = RequestProcessors.of(self.params.logits_processors)
        if self.params.score_targets is not None:
            n = len(self.params.score_targets)
            self.score_logprobs, self.score_greedy = [math.nan] * n, [False] * n
            if self.params.logprobs:
                self.score_top = [[] for _ in range(n)]

    @property
    def score_start(self) -> int | None:
        """Scoring: the first prompt position whose logits are read (None for a generating request)."""
        targets = self.params.score_targets
        return None if targets is None else len(self.prompt_ids) - len(targets)

    def generator_on(self, device: torch.device) -> torch.Generator | None:
        """The request's random generator, on `device` (where the probabilities it samples live: a CPU generator
        cannot draw from CUDA tensors), seeded at the first draw from `seed` or `params.seed`; None without a seed
        (torch's global generator then)."""
        if self.generator is None:
            seed = self.seed if self.seed is not None else self.params.seed
            if seed is None:
                return None
            self.generator = torch.Generator(device=device).manual_seed(seed)
        elif self.generator.device != torch.device(device):
            raise RuntimeError(f"request {self.request_id!r} drew on {self.generator.device} and now on {device}: "
                               "keep the model and its draft model on one device")
        return self.generator

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def ended(self) -> bool:
        """FINISHED or FAILED (`RequestOutput.is_finished()` is a method, as transformers' `GenerationOutput`'s)."""
        return self.status.ended

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_ids=list(self.prompt_ids),
            generated_tokens=list(self.output_ids),
            status=self.status,
            error=self.error,
            error_type=self.error_type,
            finish_reason=self.finish_reason,
            num_cached_tokens=self.num_cached_tokens,
            created_time=self.arrival_time,
            scheduled_time=self.scheduled_time if self.scheduled_time is not None else -1.0,
            lifespan=(self.first_token_time or -1.0, self.finish_time or -1.0),
            scores=self.scores or None,
            logits=self.logits or None,
            timestamps=list(self.timestamps) if self.params.record_timestamps else None,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            num_masks_computed=self.num_masks_computed,
            attempts=list(self.attempts) if self.attempts else None,
            score_logprobs=None if self.score_logprobs is None else list(self.score_logprobs),
            score_greedy=None if self.score_greedy is None else list(self.score_greedy),
            logprobs=None if self.params.logprobs is None or self.params.score_targets is not None
            else list(self.logprobs),
            score_top_logprobs=None if self.score_top is None else [list(top) for top in self.score_top],
        )


@dataclass(slots=True)
class RequestOutput:
    """What a finished (or failed) request returns; field names follow transformers' `GenerationOutput`."""

    request_id: str
    prompt_ids: list[int]
    generated_tokens: list[int]
    status: RequestStatus
    error: str | None = None
    finish_reason: str | None = None  # "stop", "length", "length_incomplete" / "stop_incomplete" (a constrained
    # document cut short: INCOMPLETE), "scored" (a scoring request, SamplingParams.score_targets), "abort", "error"
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    created_time: float = 0.0
    scheduled_time: float = -1.0  # when it was first admitted to a step (-1: never); minus created_time: queue time
    lifespan: tuple[float, float] = (-1.0, -1.0)  # (first token time, finish time)
    scores: list[torch.Tensor] | None = None  # processed scores per generated token (output_scores)
    logits: list[torch.Tensor] | None = None  # raw logits per generated token (output_logits)
    timestamps: list[float] | None = None  # record_timestamps: `time.perf_counter()` when each token was appended
    num_draft_tokens: int = 0  # speculative decoding: drafted tokens the model verified
    num_accepted_tokens: int = 0  # of which it accepted (each saved one decode step)
    num_masks_computed: int = 0  # sampled tokens whose constraint mask was computed (constraint_mode="resample":
    # only the refused draws), over every attempt
    attempts: list[RetryAttempt] | None = None  # max_retries >= 1: every run, in order (the last is this output)
    error_type: type[BaseException] | None = None  # FAILED: the class of the exception behind `error` (a typed
    # `hf_paged.errors` class, a user processor's own exception, ...; `RequestFailedError` when none was raised)
    score_logprobs: list[float] | None = None  # scoring: each of params.score_targets' log-probability
    score_greedy: list[bool] | None = None  # scoring: whether each target was the argmax of its row
    # SamplingParams.logprobs: one entry per generated token (its log-probability and the top k), else None
    logprobs: list[TokenLogprobs] | None = None
    score_top_logprobs: list[list[TopLogprob]] | None = None  # scoring with logprobs >= 1: each target's top k

    def __getstate__(self) -> list:
        # outputs cross processes (distributed gathers, Ray): an exception class defined in a function does not
        # pickle, so it travels as RequestFailedError (its name stays in `error`)
        error_type = self.error_type
        if error_type is not None:
            try:
                pickle.dumps(error_type)
            except Exception:  # noqa: BLE001 -- any pickling failure: send the generic class
                error_type = RequestFailedError
        return [error_type if f.name == "error_type" else getattr(self, f.name) for f in fields(self)]

    def __setstate__(self, state: list) -> None:
        for f, value in zip(fields(self), state):
            object.__setattr__(self, f.name, value)

    def is_finished(self) -> bool:
        """A method, as transformers' `GenerationOutput.is_finished()` (the engine's `Request.ended` is a property)."""
        return self.status.ended

    @property
    def acceptance_rate(self) -> float | None:
        """Share of drafted tokens accepted; None when nothing was drafted."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass(slots=True)
class StepOutput:
    """What one engine step produced: new tokens per request, and the requests that ended."""

    new_tokens: dict[str, list[int]] = field(default_factory=dict)
    new_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # of new_tokens (params.logprobs)
    new_scores: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # of new_tokens (params.output_scores)
    finished: list[RequestOutput] = field(default_factory=list)


def token_ids(prompt_ids: Any) -> list[int]:
    """A prompt as a list of ints (a 1-D tensor or array, or a [1, L] one flattened; numpy's ints taken); `TypeError`
    naming the fix for anything else (a text, floats, bools, nested lists, a tensor of several rows)."""
    shape = tuple(getattr(prompt_ids, "shape", ()))
    if len(shape) > 1 and not (len(shape) == 2 and shape[0] == 1):  # rows of a batch would run as one prompt
        raise TypeError(f"prompt_ids of shape {list(shape)} is not one prompt (a list of ints, a 1-D tensor or a "
                        "[1, L] row): add one request per row, or call generate_batch with the rows")
    if len(shape) == 2:
        prompt_ids = prompt_ids[0]
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.reshape(-1)
    if hasattr(prompt_ids, "tolist"):
        prompt_ids = prompt_ids.tolist()
    try:
        if isinstance(prompt_ids, str | bytes | dict):
            raise TypeError
        items = list(prompt_ids)
        if any(isinstance(t, bool) for t in items):
            raise TypeError
        return [operator.index(t) for t in items]
    except TypeError:
        raise TypeError(f"prompt_ids must be token ids (a list of ints or a 1-D tensor), got {str(prompt_ids)[:80]!r}; "
                        "tokenize a text first: tokenizer(text)['input_ids']") from None


def checked_arguments(prompt_ids: Any, params: SamplingParams | None, priority: Any) -> tuple[list[int], SamplingParams]:
    """`Engine.add_request`'s arguments, or a `TypeError` naming the fix (a text prompt, a dict of params)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int (higher runs first), got {priority!r}")
    if params is not None and not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    return token_ids(prompt_ids), params or SamplingParams()


def checked_submission(prompts: Sequence[Any], params: Sequence[SamplingParams | None], priorities: Sequence[Any] | None,
                       ) -> tuple[list[list[int]], list[SamplingParams], list[int]]:
    """An `EngineLoop` submission's prompts, params (None: the defaults) and priorities (None: 0 each), checked as
    `Engine.add_request` checks them, before any id is reserved: a text prompt or a dict of params raises its
    `TypeError` to the caller (checked only when the loop added it, it ended FAILED after a logged traceback)."""
    if len(params) != len(prompts):
        raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts; give one each")
    levels = list(priorities) if priorities is not None else [0] * len(prompts)
    if len(levels) != len(prompts):
        raise ValueError(f"got {len(levels)} priorities for {len(prompts)} prompts; give one each")
    checked = [checked_arguments(prompt, p, level) for prompt, p, level in zip(prompts, params, levels)]
    return [prompt for prompt, _ in checked], [p for _, p in checked], levels
