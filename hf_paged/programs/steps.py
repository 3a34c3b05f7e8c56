"""One call on a track: `run_gen` (generate a field, check it, regenerate it alone while the validator refuses)
and `run_select` (score every choice after the shared prefix, keep the best). Synchronous: the caller's thread
waits while the engine runs the requests among everyone else's.

A field's output is cut where the field ends (the first `stop` string, EOS, or the forced literal after a template
hole) and its tokens are kept as generated, so the next call's prompt extends them:

    generated:  [tok tok tok tok tok EOS]       value = text before the stop / the suffix
    kept:       [tok tok tok tok]               the longest run of tokens whose text starts the kept text
    pending:    "...rest of the kept text"      tokenized with the next call's text
"""

from __future__ import annotations

import json
import re

from hf_paged.batching.request import INCOMPLETE
from hf_paged.processors.choice import escape_regex
from hf_paged.programs.backend import GenRequest, Guide, RunContext
from hf_paged.programs.calls import GenCall, SelectCall
from hf_paged.programs.constraints import Regex, Schema, Text, regex_text
from hf_paged.programs.errors import FieldConstraintError, ProgramError, ValidatorError
from hf_paged.programs.healing import heal_prompt
from hf_paged.programs.hole_regex import check_composed, python_regex
from hf_paged.programs.track import Attempt, CallRecord, TokenCounts, Track

__all__ = ["field_value", "flush", "guide_for", "run_gen", "run_select", "validate"]

_PARTIAL_ESCAPE = re.compile(r"(\\+)(u[0-9a-fA-F]{0,3})?$")


def flush(run: RunContext, track: Track, what: str) -> list[int]:
    """Tokenize the track's pending text; its token ids (the next call's prompt)."""
    if track.pending or not track.ids:
        track.ids.extend(run.backend.encode(track.pending, first=not track.ids))
        track.pending = ""
    if not track.ids:
        raise ProgramError(f"{what} has no text before it and the tokenizer adds no BOS token: append a prompt "
                           "first (s += '...')")
    return list(track.ids)


def run_gen(run: RunContext, track: Track, call: GenCall) -> CallRecord:
    backend = run.backend
    what = f"hp.gen({call.name!r})"
    after_text = bool(track.pending)
    if call.heal and not backend.supports_healing:
        raise FieldConstraintError(f"{what}: heal=True needs the in-process backend (its first token is held by a "
                                   f"processor the server cannot take); drop heal= for {type(backend).__name__}")
    prompt = flush(run, track, what)
    guide = guide_for(call, what)
    healing = None
    if call.heal and guide is None and after_text:  # a constraint decides the first bytes itself
        healing = heal_prompt(backend, prompt)
        if healing is not None and _stop_in_lead(healing.lead, call.stop):
            healing = None  # the healed token would hit a stop string at once
    lead = healing.lead if healing is not None else ""
    request_prompt = healing.prompt if healing is not None else prompt
    record = CallRecord(call.name, "gen", "", "")
    for attempt in range(call.max_retries + 1):
        sampled = attempt > 0 or call.temperature > 0  # a retry samples: a greedy rerun would repeat itself
        seed = None if not sampled else (call.seed or 0) + attempt
        request = GenRequest(
            what, request_prompt,
            # the field's own tokens, and one more for EOS (or the first token of its literal) when constrained:
            # the literal comes by jump-forward within the budget; what is cut is appended as text (`_cut`)
            max_tokens=call.max_tokens + (1 if guide is not None else 0),
            sampled=sampled, temperature=call.temperature or 1.0, top_p=call.top_p, seed=seed, stop=call.stop,
            guide=guide, healing=healing,
        )
        output = backend.generate(run, request)
        cut = _cut(backend, call, output.token_ids, output.finish_reason, lead)
        if guide is not None and len(cut.ids) - cut.num_forced > call.max_tokens:  # the spare token went into the
            cut = _cut_to_budget(backend, call, guide, output.token_ids[: call.max_tokens], lead)  # value: cut back
        valid = cut.complete and validate(call, cut.value)
        record.tokens.add(TokenCounts(output.num_prompt_tokens - output.num_cached_tokens, output.num_cached_tokens,
                                      len(output.token_ids), cut.num_forced, 1))
        record.attempts.append(Attempt(cut.value, cut.finish_reason, valid, seed))
        if valid:
            break
    record.value, record.finish_reason, record.valid = cut.value, cut.finish_reason, valid
    del track.ids[len(request_prompt):]  # (a healed prompt gave its last token back: the output starts with it)
    track.ids.extend(cut.ids)  # (the pending text was flushed into the prompt)
    track.text += cut.kept_text[len(lead):]
    track.pending = cut.tail
    track.fields[call.name] = field_value(call, cut.value)
    track.calls.append(record)
    backend.pin(track)
    return record


def run_select(run: RunContext, track: Track, call: SelectCall) -> CallRecord:
    backend = run.backend
    what = f"hp.select({call.name!r})"
    prompt = flush(run, track, what)
    texts = call.texts or call.choices
    encoded = [backend.encode(text, first=False) for text in texts]
    for choice, ids in zip(call.choices, encoded):
        if not ids:
            raise ProgramError(f"{what}: choice {choice!r} encodes to no tokens; give non-empty choices")
    prompts = [prompt + ids for ids in encoded]  # each choice's tokens scored after the shared prompt
    block_size = backend.block_size
    new_full_blocks = len(prompt) // block_size - len(track.pinned or ()) // block_size
    if len(prompts) > 1 and new_full_blocks > 0:  # a leader computes the new full blocks; the others share them
        parts = [backend.score(run, what, prompts[:1], len(prompt)), backend.score(run, what, prompts[1:], len(prompt))]
    else:
        parts = [backend.score(run, what, prompts, len(prompt))]
    record = CallRecord(call.name, "select", "", "scored")
    scores: dict[str, float] = {}
    for choice, logprobs in zip(call.choices, [lp for part in parts for lp in part.logprobs]):
        total = float(sum(logprobs))
        scores[choice] = total / len(logprobs) if call.normalize == "mean" else total
    for part in parts:
        record.tokens.add(TokenCounts(part.num_prompt_tokens - part.num_cached_tokens, part.num_cached_tokens, 0, 0,
                                      len(part.logprobs)))
    best = max(range(len(call.choices)), key=lambda i: (scores[call.choices[i]], -i))  # ties: the earliest
    record.value, record.scores = call.choices[best], scores
    record.attempts.append(Attempt(record.value, "scored", True, None))
    track.append_tokens(encoded[best], texts[best])
    track.fields[call.name] = call.choices[best]
    track.calls.append(record)
    backend.pin(track)
    return record


# -- internals ----------------------------------------------------------------------------------------------
class _Cut:
    __slots__ = ("complete", "finish_reason", "ids", "kept_text", "num_forced", "tail", "value")

    def __init__(self, value, kept_text, ids, tail, finish_reason, complete, num_forced) -> None:
        self.value = value  # the field's text
        self.kept_text = kept_text  # what the track gets: the value and the forced suffix
        self.ids = ids  # the generated tokens kept (their text starts kept_text)
        self.tail = tail  # the rest of kept_text, appended as text
        self.finish_reason = finish_reason
        self.complete = complete  # the constraint closed (or free text)
        self.num_forced = num_forced  # kept tokens wholly inside the suffix


def _cut(backend, call: GenCall, generated: list[int], finish_reason: str, lead: str = "") -> _Cut:
    """Where the field ends in `generated`; `lead`: text the output starts with that is not the field's (the token
    given back by healing; `kept_text` starts with it)."""
    ids = list(generated)
    while ids and ids[-1] in backend.eos_ids:
        ids.pop()
    text = backend.decode(ids)
    if lead and text.startswith(lead):
        text = text[len(lead):]
    complete = finish_reason not in INCOMPLETE or isinstance(call.constraint, Text | None)
    stops = [text.find(s) for s in call.stop if s in text]
    if stops:
        value, finish_reason = text[: min(stops)], "stop"
    elif call.suffix and text.endswith(call.suffix):
        value, finish_reason = text[: -len(call.suffix)], "stop"
    else:
        value = text
        if call.suffix:  # the field ran out of tokens before its literal (or within it): close it here
            finish_reason = "length"
            value = _before_partial_suffix(call, text)
            if call.json_string:
                value = _trim_partial_escape(value)
    if call.suffix and not complete:  # cut in the literal after a whole value: the value is complete
        complete = _matches(call.regex, value)
    kept_text = lead + value + call.suffix
    if backend.decode(ids) != kept_text:
        while ids and not kept_text.startswith(backend.decode(ids)):
            ids.pop()
    ids_text = backend.decode(ids)
    num_forced = 0
    if call.suffix and ids:
        k = 0
        while k < len(ids) and len(backend.decode(ids[:k])) < len(lead) + len(value):
            k += 1
        num_forced = len(ids) - k
    return _Cut(value, kept_text, ids, kept_text[len(ids_text):], finish_reason, complete, num_forced)


def _cut_to_budget(backend, call: GenCall, guide: Guide, kept: list[int], lead: str) -> _Cut:
    """The field cut back to its `max_tokens` tokens. Whole when the value's own constraint (the field's regex
    without its forced literal) accepts those tokens: the automaton's answer, for any pattern (Python's `re`, which
    `_cut` falls back on, cannot read `(?i)` inside a group or `\\p{..}`). Asked only when the tokens are the value
    exactly (no start of the literal among them)."""
    cut = _cut(backend, call, kept, "length_incomplete", lead)
    if cut.complete or backend.decode(kept) != lead + cut.value or (call.suffix and call.regex is None):
        return cut
    value_guide = Guide("regex", call.regex) if call.suffix else guide
    if backend.accepts(value_guide, kept):
        cut.complete, cut.finish_reason = True, "length"
    return cut


def _stop_in_lead(lead: str, stops: tuple[str, ...]) -> bool:
    """Whether a stop string can match a healed output at a position inside `lead` (the output starts with it, and
    the engine looks for stops in the output): one inside the lead, or one that starts with a suffix of it."""
    return any(s in lead or any(s.startswith(lead[k:]) for k in range(len(lead))) for s in stops)


def _matches(pattern: str | None, value: str) -> bool:
    """Whether `value` is a whole match of the field's regex (False when Python's `re` cannot read it)."""
    compiled = python_regex(pattern)
    return compiled is not None and compiled.fullmatch(value) is not None


def _before_partial_suffix(call: GenCall, text: str) -> str:
    """The value of a field cut short, without the start of its literal: the first split where the rest begins the
    literal and the value matches the field's regex (Python's `re`, when it reads the pattern)."""
    pattern = python_regex(call.regex)
    for k in range(len(text) + 1):
        if call.suffix.startswith(text[k:]) and (pattern is None or pattern.fullmatch(text, 0, k) is not None):
            return text[:k]
    return text


def _trim_partial_escape(body: str) -> str:
    match = _PARTIAL_ESCAPE.search(body)
    if match is None or len(match.group(1)) % 2 == 0:
        return body
    return body[: match.start() + len(match.group(1)) - 1]


def validate(call: GenCall, value: str) -> bool:
    """The field's validator on its value; `ValidatorError` naming the field when the validator raises."""
    if call.validator is None:
        return True
    try:
        verdict = call.validator(field_value(call, value))
    except Exception as exc:  # any validator failure is the caller's bug: name the field
        raise ValidatorError(f"the validator of field {call.name!r} raised {type(exc).__name__}: {exc}; make it "
                             "return True/False") from exc
    return bool(verdict)


def field_value(call: GenCall, value: str):
    """A field's value from its text: a JSON string body decoded, a schema field parsed, else the text."""
    if call.json_string:
        try:
            return json.loads('"' + value + '"')
        except ValueError:
            return value
    if isinstance(call.constraint, Schema):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def guide_for(call: GenCall, what: str) -> Guide | None:
    """The constraint that holds the field (and its forced suffix), as data for the backend; None: free text. A
    regex field's composed regex is compiled here, so that an error names the user's pattern (`hole_regex`)."""
    constraint = call.constraint if call.constraint is not None else Text(call.max_tokens, None, 0)
    suffix = escape_regex(call.suffix)
    stop_char = call.suffix[0] if call.suffix else None
    flat = call.regex
    if flat is None and not (isinstance(constraint, Text) and not call.suffix):
        flat = regex_text(constraint, json_string=call.json_string, stop_char=stop_char, where=what)
    if flat is not None and isinstance(constraint, Regex):
        check_composed(what, constraint.pattern, flat + suffix, call.suffix)
    if flat is not None:
        return Guide("regex", flat + suffix)
    if isinstance(constraint, Text):
        return None
    if isinstance(constraint, Schema):
        return Guide("json_schema", constraint.schema)
    return Guide("grammar", constraint.grammar, constraint.start)
