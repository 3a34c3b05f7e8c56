"""Retries of constrained requests (`SamplingParams.max_retries`): the policy, apart from the engine's mechanism.

When a request with `max_retries >= 1` ends normally, `Retrier.end_attempt` records the attempt and decides:

    finished --"length_incomplete" / "stop_incomplete"?--------> retry (attempts left) | final
             \\-- validator(text) (default: JSON Schema) false? --> retry (attempts left) | final (valid=False)
                                                         true  --> final (valid=True)

A retry is a fresh `Request` under the same id and prompt, with a seed derived from the request's own seed and the
attempt number (`retry_seed`: the same reruns on any machine); the engine queues it, and its prompt's full blocks,
cached while the first attempt ran, come back as prefix hits. The caller sees one request: its output is the first
valid attempt or the last one, and `RequestOutput.attempts` lists every run. Aborted and failed requests are not
retried. Greedy requests rerun the same tokens (only a validator that changes its mind makes that useful).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hf_paged.batching.request import (
    INCOMPLETE,
    Failure,
    Request,
    RequestOutput,
    RequestStatus,
    RetryAttempt,
)
from hf_paged.batching.sampling import SamplingParams

__all__ = ["AttemptEnd", "Retrier", "document_text", "num_generated_tokens", "retry_seed", "schema_validator"]


@dataclass(slots=True)
class AttemptEnd:
    """What `Retrier.end_attempt` decided for a request that ended."""

    retry: Request | None  # the next attempt to queue, or None: the request ends now
    error: Failure | None = None  # the validator raised: the request ends FAILED with this error


def retry_seed(seed: int | None, fork_index: int, attempt: int) -> int | None:
    """The seed of attempt `attempt` (1, 2, ...; 0: a fork's first run) of fork `fork_index` (0: the request
    itself): a digest of the request's seed, so reruns are reproducible and no two requests' streams coincide;
    None when the request has no seed (the global generator then)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}/{fork_index}/{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def num_generated_tokens(request: Any) -> int:
    """Tokens a `Request` or `RequestOutput` generated over all its attempts (max_retries: every run's, the refused
    ones included; else its own): what its usage bills, what `generation_tokens_total` counted, what its time per
    output token divides by. Every attempt's tokens were computed and sampled, so a retried request costs them all
    (OpenAI and vLLM have no retries; `n` choices' usage likewise counts every choice's tokens)."""
    attempts = request.attempts
    return sum(a.num_tokens for a in attempts) if attempts else len(request.generated_tokens if isinstance(
        request, RequestOutput) else request.output_ids)


def document_text(request: Request) -> str | list[int]:
    """The attempt's output as a validator reads it: text decoded by `params.tokenizer`, else the bytes the
    constraint's vocabulary gives its tokens (EOS dropped); the token ids when neither can decode."""
    params = request.params
    if params.tokenizer is not None:
        return params.tokenizer.decode(request.output_ids, skip_special_tokens=True)
    for proc in request.processors.constraints:
        compiled = getattr(proc, "compiled", None)  # our processors' token index (not part of RequestConstraint)
        if compiled is not None:
            token_bytes = compiled.index.trie.token_bytes
            size = len(token_bytes)
            raw = b"".join(token_bytes[t] or b"" for t in request.output_ids if 0 <= t < size)
            return raw.decode("utf-8", errors="replace")
    return list(request.output_ids)


def schema_validator(schema: Any) -> Callable[[str | list[int]], bool]:
    """JSON text -> does it parse and satisfy `schema` (the `jsonschema` package's validator for its draft)."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)

    def valid(text: str | list[int]) -> bool:
        if not isinstance(text, str):
            return False
        try:
            document = json.loads(text)
        except ValueError:
            return False
        return validator.is_valid(document)

    return valid


def schema_processor(params: SamplingParams) -> Any:
    """The request's `JSONSchemaLogitsProcessor` (whose schema the default validator checks), or None."""
    from hf_paged.processors import JSONSchemaLogitsProcessor

    return next((p for p in params.logits_processors if isinstance(p, JSONSchemaLogitsProcessor)), None)


class Retrier:
    """Decides, at the end of each attempt of a request with `max_retries`, whether it runs again."""

    def __init__(self) -> None:
        self.num_retries = 0  # attempts rerun
        self.num_retried_requests = 0  # requests that ran more than once (counted at their first retry)
        # processor -> its schema's validator, built once per processor; weak: an entry lives as long as its
        # processor and holds nothing alive (a processor keeps its compiled token index, which can weigh tens of MB)
        self._validators: weakref.WeakKeyDictionary[Any, Callable] = weakref.WeakKeyDictionary()

    def end_attempt(self, request: Request, status: RequestStatus, reason: str) -> AttemptEnd:
        """Record the attempt that ended with `status`/`reason`; return the next attempt, or None for the end."""
        params = request.params
        valid: bool | None = None
        if status is RequestStatus.FINISHED and reason not in INCOMPLETE:
            validator = params.validator or self._default(params)
            if validator is not None:
                try:
                    valid = bool(validator(document_text(request)))
                except Exception as exc:  # noqa: BLE001 -- a user's validator failed: this request fails alone
                    request.attempts.append(self._attempt(request, "error", None))
                    return AttemptEnd(None, Failure(f"validator raised {type(exc).__name__}: {exc}; fix the validator",
                                                    type(exc)))
        request.attempts.append(self._attempt(request, reason, valid))
        refused = status is RequestStatus.FINISHED and (reason in INCOMPLETE or valid is False)
        if not refused or len(request.attempts) > params.max_retries:
            return AttemptEnd(None)
        return AttemptEnd(self._next(request))

    def _attempt(self, request: Request, reason: str, valid: bool | None) -> RetryAttempt:
        seed = request.seed if request.seed is not None else request.params.seed
        return RetryAttempt(reason, list(request.output_ids), request.num_cached_tokens, seed, valid)

    def _next(self, request: Request) -> Request:
        attempt = len(request.attempts)
        if attempt == 1:
            self.num_retried_requests += 1
        self.num_retries += 1
        retry = Request(request.request_id, request.prompt_ids, request.params, request.priority,
                        request.arrival_index)
        # the request's clock runs from its first attempt: arrival, first admission (its queue time) and first token
        retry.arrival_time, retry.first_token_time = request.arrival_time, request.first_token_time
        retry.scheduled_time = request.scheduled_time
        retry.parent_id, retry.fork_index = request.parent_id, request.fork_index
        retry.attempts = request.attempts
        retry.num_masks_computed = request.num_masks_computed
        retry.seed = retry_seed(request.params.seed, request.fork_index, attempt)
        return retry

    def _default(self, params: SamplingParams) -> Callable | None:
        """JSON Schema validation for a `JSONSchemaLogitsProcessor` request; else None (only cut-short documents
        are retried)."""
        proc = schema_processor(params)
        if proc is None:
            return None
        validator = self._validators.get(proc)
        if validator is None:
            validator = self._validators[proc] = schema_validator(proc.schema)
        return validator
