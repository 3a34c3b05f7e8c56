"""One-shot filling: the whole template as one regex (each hole's regex between its escaped literals), generated in
one request whose literals the constraint forces (jump-forward), then split back into fields.

A field that did not close (the request ran out of tokens) or that its validator refuses ends the one-shot part:
the text before that field is kept (its tokens stay in the prefix cache) and `fill` goes on item by item from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_paged.processors.choice import escape_regex
from hf_paged.programs.backend import RunContext
from hf_paged.programs.calls import GenCall
from hf_paged.programs.constraints import Text, regex_text
from hf_paged.programs.errors import TemplateError
from hf_paged.programs.hole_regex import python_regex
from hf_paged.programs.steps import field_value, flush, run_gen, validate
from hf_paged.programs.template import TemplatePlan
from hf_paged.programs.track import Attempt, CallRecord, TokenCounts, Track

__all__ = ["OneShot", "run_one_shot", "split_fields"]

_SAMPLE = "The quick brown fox jumps over the lazy dog, then rests: 42 times in 2024."
_MAX_CHARS = 512  # longest free-text hole in characters (a bounded repetition adds one automaton state each)


@dataclass(slots=True)
class OneShot:
    """`redo_from`: the first hole to fill item by item (len(holes): none); `records`: the fields taken from the
    generation, and the refused/cut field's attempt; `tokens`: the one request's tokens."""

    redo_from: int
    records: dict[str, CallRecord] = field(default_factory=dict)
    tokens: TokenCounts = field(default_factory=TokenCounts)


def run_one_shot(run: RunContext, track: Track, plan: TemplatePlan, calls: list[GenCall]) -> OneShot:
    backend = run.backend
    chars_per_token = len(_SAMPLE) / max(1, len(backend.encode(_SAMPLE, first=False)))
    flats, budget = [], 1
    for i, hole in enumerate(plan.holes):
        literal = plan.next_literal(i)
        bound = min(_MAX_CHARS, max(1, round(hole.constraint.max_tokens * chars_per_token))) \
            if isinstance(hole.constraint, Text) else None
        # a free text is bounded by its characters (the regex), and a character is at most 4 byte-level tokens
        budget += 4 * bound if bound is not None else hole.constraint.max_tokens
        flat = regex_text(hole.constraint, json_string=hole.json_string, stop_char=literal[:1] or None,
                          max_chars=bound, where=f"hole [{hole.name}]")
        if flat is None:
            raise TemplateError(
                f"hole [{hole.name}]: its constraint compiles to recursive rules, not one regex, so mode='one_shot' "
                "cannot force the literals around it; use mode='item_by_item'"
            )
        flats.append(flat)
    pattern = "".join(flat + escape_regex(plan.next_literal(i)) for i, flat in enumerate(flats))
    budget += len("".join(plan.literals[1:]).encode("utf-8"))  # literals: at most one token per byte
    prompt_len, text_before = len(flush(run, track, "fill")), track.text
    whole = GenCall("<template>", budget, temperature=calls[0].temperature, seed=calls[0].seed, regex=pattern)
    record = run_gen(run, track, whole)
    track.calls.pop()
    del track.fields["<template>"]
    output = record.value
    result = OneShot(len(plan.holes), tokens=record.tokens)
    seed = record.attempts[-1].seed
    spans = split_fields(output, plan, flats, record.finish_reason == "stop")
    literals = [(end, end + len(plan.next_literal(i))) for i, (_, end, closed) in enumerate(spans) if closed]
    result.tokens.forced = _tokens_within(backend, track.ids[prompt_len:], literals)
    for i, (start, end, closed) in enumerate(spans):
        call, value = calls[i], output[start:end]
        valid = closed and validate(call, value)
        reason = "stop" if closed else "length"
        result.records[call.name] = CallRecord(call.name, "one_shot", value, reason,
                                               [Attempt(value, reason, valid, seed)], valid)
        if not valid:  # keep the text before this field; fill goes on item by item from here
            result.redo_from = i
            _truncate(run, track, prompt_len, text_before, output[:start])
            break
        track.fields[call.name] = field_value(call, value)
    return result


def split_fields(output: str, plan: TemplatePlan, flats: list[str], finished: bool) -> list[tuple[int, int, bool]]:
    """`(start, end, closed)` of each hole's value in `output` (the text after the first literal), up to the first
    hole that did not close. A hole ends at the first occurrence of its next literal where its value matches its
    regex (Python's `re`, when it reads the pattern)."""
    spans, pos = [], 0
    for i in range(len(plan.holes)):
        literal = plan.next_literal(i)
        pattern = python_regex(flats[i])
        if not literal:
            end = len(output)
            closed = i == len(plan.holes) - 1 and finished and (pattern is None
                                                                or pattern.fullmatch(output, pos, end) is not None)
            spans.append((pos, end, closed))
            if not closed:
                return spans
            pos = end
            continue
        found, at = None, output.find(literal, pos)
        while at != -1:
            if pattern is None or pattern.fullmatch(output, pos, at) is not None:
                found = at
                break
            at = output.find(literal, at + 1)
        if found is None:
            spans.append((pos, len(output), False))
            return spans
        spans.append((pos, found, True))
        pos = found + len(literal)
    return spans


def _tokens_within(backend, ids: list[int], spans: list[tuple[int, int]]) -> int:
    """Tokens of `ids` whose text lies wholly inside one of `spans` (character ranges of their decoded text)."""
    ends = [len(backend.decode(ids[: k + 1])) for k in range(len(ids))]
    count, start = 0, 0
    for end in ends:
        if end > start and any(a <= start and end <= b for a, b in spans):
            count += 1
        start = end
    return count


def _truncate(run: RunContext, track: Track, prompt_len: int, text_before: str, kept: str) -> None:
    """Keep the prompt and `kept` (generated text before the refused field): the generated tokens whose text
    starts `kept`, the rest as pending text; pin that prefix."""
    backend = run.backend
    ids = track.ids[prompt_len:]
    while ids and not kept.startswith(backend.decode(ids)):
        ids.pop()
    del track.ids[prompt_len + len(ids):]
    track.text = text_before + kept
    track.pending = kept[len(backend.decode(ids)):]
    backend.pin(track)
