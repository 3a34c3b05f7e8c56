"""An OpenAI request -> token ids and `SamplingParams` for the engine, or an `ApiError` (400) naming the field.

Everything a request can get wrong is found here, before the engine sees it: the prompt's length against the
model's positions and the block pool, `max_tokens`, the sampling fields, and the output constraint (compiled
through `ConstraintCache`, so a schema is compiled once and its processor serves every request that names it).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from hf_paged.batching.engine import Engine
from hf_paged.batching.sampling import SamplingParams, as_list
from hf_paged.errors import PromptTooLongError, SchemaError, TokenizerError
from hf_paged.serving.defaults import RequestDefaults
from hf_paged.serving.errors import ApiError
from hf_paged.serving.prompt_chars import max_prompt_chars
from hf_paged.serving.prompt_text import PromptText, prompt_text
from hf_paged.serving.protocol import ChatCompletionRequest, CompletionRequest, UnsupportedField, _Sampling

__all__ = ["DEFAULT_MAX_STOP_SEQUENCES", "Constraint", "ConstraintCache", "PreparedRequest", "Preparer"]

# Most `stop` strings a request may send (`--max-stop-sequences`). OpenAI takes 4 and TGI 4 by default; lm-eval's
# local-completions sends a task's whole `until` list (a handful), so the bound leaves room for any of those.
DEFAULT_MAX_STOP_SEQUENCES = 64
MIN_TEMPERATURE = 1e-5  # a lower positive temperature samples greedily: its logits overflow (vLLM: greedy below it)


@dataclass(slots=True)
class PreparedRequest:
    prompts: list[list[int]]  # one engine request per prompt (each with n forks)
    params: SamplingParams
    stop: list[str] = field(default_factory=list)  # cut from the text the client sees
    retention: tuple[int | None, float] | None = None  # (tokens or None: all, seconds): keep prompts cached
    echo_texts: list[PromptText] | None = None  # completions' echo: each prompt as sent (`prompt_text.py`)


@dataclass(frozen=True, slots=True)
class Constraint:
    """A request's output constraint: its kind, its spec, the field that gave it, and for a JSON schema whether
    objects get their declared keys only (`response_format`'s `strict: true`, OpenAI's strict reading)."""

    kind: str  # "json_schema" | "regex" | "choice" | "grammar"
    spec: Any
    param: str
    declared_keys_only: bool = False


class ConstraintCache:
    """Output-constraint processors by (kind, canonical spec), least recently used dropped past `capacity` entries
    or past `max_bytes` of compiled indexes.

    A processor keeps one guide state per request id, so one object serves every request with the same schema. It
    also keeps its compiled token index alive (after the processors' index cache drops it), so this cache weighs
    each processor by that index (`num_index_bytes`, re-read at every `get`: an index grows as decoding memoises
    masks). A request in flight holds its processor itself: dropping it here never stops a running request.

    Args:
        capacity: most processors.
        max_bytes: most bytes of their compiled indexes; None: the same budget as the process-wide index cache
            (`IndexCache.max_bytes`, `HF_PAGED_INDEX_CACHE_MB`).
    """

    def __init__(self, tokenizer: Any, eos_token_ids: list[int], capacity: int = 64,
                 max_bytes: int | None = None) -> None:
        from hf_paged.processors.index import default_index_cache
        from hf_paged.processors.index.byte_lru import ByteLRU

        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.capacity = capacity
        self.max_bytes = max_bytes if max_bytes is not None else default_index_cache().max_bytes
        self._items: ByteLRU[Any] = ByteLRU(capacity, self.max_bytes)
        self._lock = threading.Lock()

    @property
    def num_bytes(self) -> int:
        """Bytes of the processors' compiled indexes, as weighed at the last `get`."""
        return self._items.num_bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, kind: str, spec: Any, whitespace: str | None = None, declared_keys_only: bool = False,
            number_digits: Any = None) -> Any:
        """The processor for a constraint (built on a miss: call from a worker thread, it may compile);
        `whitespace`: a JSON constraint's whitespace regex (None: the processor's bounded default);
        `declared_keys_only`: a JSON schema's objects without `additionalProperties` get their declared keys only;
        `number_digits`: a JSON constraint's `NumberDigits` (None: the processor's default)."""
        digits = None if number_digits is None else (number_digits.integer, number_digits.fraction,
                                                     number_digits.exponent)
        key = (kind, json.dumps(spec, sort_keys=False, separators=(",", ":")), whitespace, declared_keys_only, digits)
        with self._lock:
            processor = self._items.get(key)
        if processor is None:
            processor = self._build(kind, spec, whitespace, declared_keys_only, number_digits)
        with self._lock:
            if self._items.peek(key) is None:
                self._items.put(key, processor, 0)
            processor = self._items.get(key)
            self._weigh(key)
        return processor

    def _weigh(self, key: tuple) -> None:
        """Re-read every processor's index bytes (they compile and grow after they are stored), then enforce the
        budget; never drops `key`'s, the one asked for now."""
        for other in list(self._items):
            if other != key:
                self._items.resize(other, _index_bytes(self._items.peek(other)), touch=False, enforce=False)
        self._items.resize(key, _index_bytes(self._items.peek(key)))

    def _build(self, kind: str, spec: Any, whitespace: str | None, declared_keys_only: bool,
               number_digits: Any) -> Any:
        from hf_paged.processors import (
            ChoiceLogitsProcessor,
            GrammarLogitsProcessor,
            JSONSchemaLogitsProcessor,
            RegexLogitsProcessor,
        )

        eos = self.eos_token_ids or None
        if kind == "json_schema":
            return JSONSchemaLogitsProcessor(spec, self.tokenizer, eos_token_id=eos, whitespace=whitespace,
                                             undeclared_keys=not declared_keys_only, number_digits=number_digits)
        if kind == "regex":
            return RegexLogitsProcessor(spec, self.tokenizer, eos_token_id=eos)
        if kind == "grammar":
            return GrammarLogitsProcessor(spec, self.tokenizer, eos_token_id=eos)
        return ChoiceLogitsProcessor(spec, self.tokenizer, eos_token_id=eos)


def _index_bytes(processor: Any) -> int:
    return int(getattr(processor, "num_index_bytes", 0))  # (a processor of another kind: weighs nothing)


def constraint_of(request: _Sampling) -> Constraint | None:
    """The request's output constraint, or None."""
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_schema":
        return Constraint("json_schema", fmt.json_schema.schema_, "response_format",
                          declared_keys_only=bool(fmt.json_schema.strict))
    if fmt is not None and fmt.type == "json_object":
        return Constraint("json_schema", {"type": "object"}, "response_format")
    if request.guided_json is not None:
        return Constraint("json_schema", request.guided_json, "guided_json")
    if request.guided_regex is not None:
        return Constraint("regex", request.guided_regex, "guided_regex")
    if request.guided_choice is not None:
        return Constraint("choice", request.guided_choice, "guided_choice")
    if request.guided_grammar is not None:
        return Constraint("grammar", request.guided_grammar, "guided_grammar")
    return None


def checked_bias(request: _Sampling, vocab_size: int) -> dict[int, float] | None:
    """The request's `logit_bias` as `{token id: bias}`, or a 400 naming an id outside the vocabulary."""
    try:
        return request.token_bias(vocab_size)
    except UnsupportedField as exc:
        raise ApiError(str(exc), param=exc.param, code="invalid_value") from None


def build_constraint(cache: ConstraintCache, request: _Sampling) -> list:
    """The request's processors (at most one); schema errors become a 400 naming the keyword's JSON pointer."""
    from hf_paged.processors.schema import DEFAULT_DIGITS, NumberDigits

    found = constraint_of(request)
    whitespace, digits = request.guided_whitespace_pattern, request.guided_number_digits
    for name, value in (("guided_whitespace_pattern", whitespace), ("guided_number_digits", digits)):
        if value is not None and (found is None or found.kind != "json_schema"):
            given = f"with {found.param}" if found is not None else "without one"
            raise ApiError(f"{name} applies to JSON constraints (response_format, guided_json); leave it out {given}",
                           param=name, code="invalid_value")
    if found is None:
        return []
    number_digits = None if digits is None else NumberDigits(*(  # a part left out keeps the default's bound
        getattr(DEFAULT_DIGITS, part) if getattr(digits, part) is None else getattr(digits, part)
        for part in ("integer", "fraction", "exponent")))
    try:
        return [cache.get(found.kind, found.spec, whitespace, found.declared_keys_only, number_digits)]
    except (SchemaError, TokenizerError, TypeError) as exc:
        raise ApiError(f"{found.param}: {exc}", param=found.param,
                       code="invalid_schema" if found.kind == "json_schema" else f"invalid_{found.kind}") from None
    except RecursionError:
        raise ApiError(f"{found.param}: the schema nests too deeply to compile; flatten it", param=found.param,
                       code="invalid_schema") from None


class Preparer:
    """Turns requests into engine work for one engine and tokenizer."""

    def __init__(self, engine: Engine, tokenizer: Any, max_retention_s: float = 0.0,
                 defaults: RequestDefaults | None = None, *,
                 max_stop_sequences: int = DEFAULT_MAX_STOP_SEQUENCES) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_retention_s = max_retention_s  # the server's --max-cache-retention (0: the field is refused)
        self.max_stop_sequences = max_stop_sequences  # the server's --max-stop-sequences (0: no bound)
        self.defaults = defaults or RequestDefaults()  # for omitted sampling fields (`defaults.py`)
        gen_eos = as_list(getattr(engine.model.generation_config, "eos_token_id", None))
        tok_eos = [tokenizer.eos_token_id] if getattr(tokenizer, "eos_token_id", None) is not None else []
        self.eos_token_ids = list(dict.fromkeys(gen_eos + tok_eos))
        self.constraints = ConstraintCache(tokenizer, self.eos_token_ids)

    # -- requests ----------------------------------------------------------------------------------------
    def completion(self, request: CompletionRequest) -> PreparedRequest:
        sent = request.prompts()
        prompts = [list(prompt) if isinstance(prompt, list) else self.tokenize(prompt, "prompt") for prompt in sent]
        max_tokens = request.max_tokens if "max_tokens" in request.model_fields_set else None
        prepared = self._prepare(request, prompts, max_tokens, "prompt", default_to_room=False)
        if request.echo:
            prepared.echo_texts = [prompt_text(self.tokenizer, s, ids) for s, ids in zip(sent, prompts)]
        return prepared

    def chat(self, request: ChatCompletionRequest) -> PreparedRequest:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(
                "this model's tokenizer has no chat template; use /v1/completions, or start the server with "
                "--chat-template FILE", param="messages", code="no_chat_template",
            )
        messages = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in request.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 -- a template error is the request's (e.g. roles out of order)
            raise ApiError(f"the chat template refused these messages: {exc}", param="messages",
                           code="chat_template_error") from None
        ids = self.tokenize(text, "messages", add_special_tokens=False)
        return self._prepare(request, [ids], request.requested_max_tokens, "messages", default_to_room=True)

    @cached_property
    def _max_chars(self) -> int | None:  # read from the vocabulary on the first text prompt
        return max_prompt_chars(self.tokenizer, self.engine.max_model_len)

    def tokenize(self, text: str, param: str, **kwargs: Any) -> list[int]:
        """`text`'s token ids; a text too long for any tokenization to fit is refused before tokenizing."""
        if self._max_chars is not None and len(text) > self._max_chars:
            raise ApiError(f"the {param} is {len(text):,} characters, more than any text of at most this model's "
                           f"{self.engine.max_model_len} tokens can have ({self._max_chars:,} with this vocabulary); "
                           f"shorten the {param}", param=param, code="context_length_exceeded")
        return self.tokenizer(text, **kwargs)["input_ids"]

    # -- shared ------------------------------------------------------------------------------------------
    def _prepare(self, request: _Sampling, prompts: list[list[int]], max_tokens: int | None, prompt_param: str,
                 *, default_to_room: bool) -> PreparedRequest:
        max_len = self.engine.max_model_len
        longest = max(len(p) for p in prompts)
        if max_tokens is None:  # omitted: the config's max_new_tokens, else chat's room or completions' 16
            pool_tokens = self.engine.cache.num_blocks * self.engine.config.block_size
            room = max(min(max_len, pool_tokens) - longest, 1)
            configured = self.defaults.max_tokens  # the checkpoint's max_new_tokens (chat: within the room)
            if default_to_room:
                max_tokens = min(room, configured) if configured is not None else room
            else:  # completions: OpenAI's 16
                max_tokens = configured if configured is not None else 16
        name = "max_completion_tokens" if getattr(request, "max_completion_tokens", None) is not None else "max_tokens"
        if max_tokens < 1:
            raise ApiError(f"{name} must be at least 1, got {max_tokens}", param=name, code="invalid_value")
        if request.min_tokens > max_tokens:  # the engine would stop at max_tokens: min_tokens could not hold
            raise ApiError(f"min_tokens={request.min_tokens} is more than max_tokens={max_tokens}; lower min_tokens or "
                           "raise max_tokens", param="min_tokens", code="invalid_value")
        for prompt in prompts:
            self._check_prompt(prompt, max_tokens, prompt_param, name)
        stop = self._stop(request)
        found = constraint_of(request)
        if request.min_tokens and found is not None:  # (the engine's refusal, named as the request names it)
            raise ApiError(f"min_tokens holds the end of text back past the end of the {found.param} document, where "
                           "nothing else is allowed: leave min_tokens out and bound the document's own length "
                           "(minLength, minItems, the pattern)", param="min_tokens", code="invalid_value")
        processors = list(build_constraint(self.constraints, request))
        penalty = request.repetition_penalty if request.repetition_penalty is not None \
            else self.defaults.repetition_penalty
        if penalty not in (None, 1, 1.0):
            from transformers import RepetitionPenaltyLogitsProcessor

            processors.append(RepetitionPenaltyLogitsProcessor(float(penalty)))
        try:
            params = self._sampling_params(request, max_tokens, stop, processors)
        except ValueError as exc:  # a value the engine refuses that the request's own checks let through
            raise ApiError(str(exc), code="invalid_value") from None
        return PreparedRequest(prompts, params, stop, self._retention(request))

    def _stop(self, request: _Sampling) -> list[str]:
        """The request's stop strings, at most `max_stop_sequences` of them: the engine checks every one after each
        token of the request, on the thread every request's step runs on (a 12 MB list of a million made a batch of
        eight others 18x slower)."""
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        bound = self.max_stop_sequences
        if bound and len(stop) > bound:
            raise ApiError(f"stop has {len(stop):,} sequences; this server takes at most {bound} (its "
                           "--max-stop-sequences): send fewer", param="stop", code="invalid_value")
        return stop

    def _retention(self, request: _Sampling) -> tuple[int | None, float] | None:
        seconds, tokens = request.cache_retention_seconds, request.cache_retention_tokens
        if seconds is None:
            if tokens is not None:
                raise ApiError("cache_retention_tokens needs cache_retention_seconds (how long to keep them)",
                               param="cache_retention_tokens", code="invalid_value")
            return None
        if seconds > self.max_retention_s:
            fix = ("this server keeps no prefix on request (start it with --max-cache-retention SECONDS)"
                   if not self.max_retention_s else f"this server allows at most {self.max_retention_s:g} s")
            raise ApiError(f"cache_retention_seconds={seconds:g}: {fix}", param="cache_retention_seconds",
                           code="invalid_value")
        if not self.engine.config.enable_prefix_caching:
            raise ApiError("cache_retention_seconds needs the prefix cache, which this server runs without "
                           "(--no-prefix-caching)", param="cache_retention_seconds", code="invalid_value")
        return tokens, float(seconds)

    def _sampling_params(self, request: _Sampling, max_tokens: int, stop: list[str], processors: list) -> SamplingParams:
        # a field the request omits takes the server's default (the checkpoint's generation_config, `defaults.py`)
        defaults = self.defaults
        temperature = request.temperature if request.temperature is not None else defaults.temperature
        top_p = request.top_p if request.top_p is not None else defaults.top_p
        top_k = request.top_k if request.top_k is not None else defaults.top_k
        min_p = request.min_p if request.min_p is not None else defaults.min_p
        greedy = temperature is not None and temperature < MIN_TEMPERATURE  # (sampling's limit as it falls)
        bias = checked_bias(request, self.engine.vocab_size)
        return SamplingParams(
            max_new_tokens=max_tokens,
            do_sample=not greedy,
            temperature=1.0 if greedy or temperature is None else float(temperature),  # (greedy reads none)
            top_p=float(top_p) if top_p is not None else 1.0,
            top_k=top_k if top_k and top_k > 0 else None,
            min_p=float(min_p or 0),
            seed=request.seed,
            eos_token_id=None if request.ignore_eos else (self.eos_token_ids or None),
            stop_strings=stop or None,
            tokenizer=self.tokenizer if stop else None,
            logits_processors=processors,
            num_return_sequences=request.n,
            min_new_tokens=request.min_tokens,
            logprobs=request.num_logprobs,
            presence_penalty=float(request.presence_penalty or 0),
            frequency_penalty=float(request.frequency_penalty or 0),
            logit_bias=bias,
        )

    def _check_prompt(self, prompt: list[int], max_tokens: int, param: str, max_name: str = "max_tokens") -> None:
        max_len = self.engine.max_model_len
        if not prompt:
            raise ApiError(f"{param} is empty: give at least one token", param=param, code="empty_prompt")
        if len(prompt) + max_tokens > max_len:
            raise ApiError(
                f"this model's maximum context length is {max_len} tokens, but {len(prompt)} prompt tokens plus "
                f"{max_name}={max_tokens} ask for {len(prompt) + max_tokens}; shorten the {param} or lower {max_name}",
                param=param if len(prompt) >= max_len else max_name, code="context_length_exceeded",
            )
        pool_tokens = self.engine.cache.num_blocks * self.engine.config.block_size
        if len(prompt) + 1 > pool_tokens:  # lowering max_tokens cannot help: say what can
            raise ApiError(f"the {param} is {len(prompt)} tokens but this server's KV pool holds {pool_tokens} in all "
                           f"(the prompt and at least one generated token must fit); shorten the {param}, or restart "
                           "the server with a larger --num-blocks", param=param, code="context_length_exceeded")
        error = self.engine.validate_prompt(  # the pool must hold the whole answer: refused up front, not cut short
            prompt, SamplingParams(max_new_tokens=max_tokens), whole_sequence=True, output_name=max_name,
            pool_fix="restart the server with a larger --num-blocks")
        if isinstance(error, PromptTooLongError):
            raise ApiError(str(error), param=max_name, code="context_length_exceeded")
        if error is not None:
            raise ApiError(str(error), param=param, code="invalid_prompt")
