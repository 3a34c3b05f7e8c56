"""`fill`: a template's holes filled by the model, field by field or in one constrained generation.

    item_by_item   each hole is its own call after everything before it (whose blocks come from the prefix cache):
                   a choice hole is scored (`select`); any other hole is generated under its constraint followed by
                   the template's next literal (produced by jump-forward in the same request); a field refused by its
                   validator is regenerated alone, from the same cached prefix, with a new seed
    one_shot       one generation under the whole template as one regex (literals forced: jump-forward); a field
                   cut short or refused by its validator is redone from there on item by item (the text before it
                   kept, its tokens cached)

The prompt and the template's first literal are the prompt of the first call in both modes. Item by item,
`parallel` groups of consecutive holes that do not depend on each other are generated at once, each in a fork of
the text before the group (the forks run in the same engine steps; their texts then follow each other as text).
A hole with an `instruction` is made the same way, in a fork whose text has the instruction between the prompt
and the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from hf_paged.programs.backend import RunContext
from hf_paged.programs.calls import GenCall, SelectCall
from hf_paged.programs.connect import backend_for
from hf_paged.programs.constraints import Choices, Regex, Text, regex_text
from hf_paged.programs.errors import FieldConstraintError, TemplateError
from hf_paged.programs.one_shot import run_one_shot
from hf_paged.programs.steps import guide_for, run_gen, run_select
from hf_paged.programs.template import TemplatePlan, parallel_groups, parse_template
from hf_paged.programs.track import Attempt, CallRecord, TokenCounts, Track

__all__ = ["MODES", "Filled", "FilledField", "fill"]

MODES = ("item_by_item", "one_shot")


@dataclass(frozen=True, slots=True)
class FilledField:
    """One hole's outcome: its value (a JSON string hole's decoded, a schema hole's parsed), its text in the
    template, why it ended, every attempt, whether it passed its validator, and the tokens of its own calls
    (item by item; a field taken from a one-shot generation has none of its own)."""

    name: str
    value: Any
    text: str
    finish_reason: str
    attempts: tuple[Attempt, ...]
    valid: bool
    tokens: TokenCounts


@dataclass(slots=True)
class Filled:
    """A filled template: `text` (the template with its holes filled, without the prompt), `fields` by name,
    `details` per field, and the tokens of every request (`tokens`: prefilled, from cache, generated, forced)."""

    text: str
    fields: dict[str, Any]
    details: dict[str, FilledField]
    mode: str
    tokens: TokenCounts = field(default_factory=TokenCounts)

    @property
    def valid(self) -> bool:
        """Every field closed and passed its validator."""
        return all(d.valid for d in self.details.values())

    @property
    def finish_reasons(self) -> dict[str, str]:
        return {name: d.finish_reason for name, d in self.details.items()}

    @property
    def attempts(self) -> dict[str, int]:
        return {name: len(d.attempts) for name, d in self.details.items()}


def fill(model, tokenizer, prompt: str, template: str, mode: str = "item_by_item", *, temperature: float = 0.0,
         seed: int | None = None, score_choices: bool = True, parallel: Sequence[Sequence[str]] = (),
         **holes: Any) -> Filled:
    """Fill `template`'s `[name]` holes after `prompt`, each under the constraint passed as `name=`.

    Args:
        model, tokenizer: a causal LM (wrapped with default settings when it is not) and its tokenizer; or
            `hp.remote(url)` (a running `hf-paged serve`) and the server model's tokenizer.
        prompt: text before the template (instructions, the input).
        template: literal text with `[name]` holes (see `programs/template.py`).
        mode: "item_by_item" (each field its own call) or "one_shot" (one constrained generation).
        temperature, seed: sampling of the generated fields (0: greedy). Retries always sample.
        score_choices: item by item, pick a choice hole by scoring every choice (`select`: the whole choice's
            log-probability, one request per choice); False: generate it under a mask (one request, as one_shot
            does, token by token).
        parallel: groups of consecutive holes that do not depend on each other (`[["s1", "s2"]]`), item by item:
            each hole of a group is generated from the text before the group, in forks that run in the same engine
            steps, none seeing the others' values; their texts are then placed in order.
        **holes: one constraint per hole: a list of choices, `hp.text(max_tokens=)`, `hp.regex(...)`,
            `hp.schema(...)`, `hp.grammar(...)`, each with its own `validator` / `max_retries` / `instruction`
            (item by item: text placed after the prompt while that field is made, in a fork; not in the record).

    Raises:
        TemplateError (a bad template, a missing or extra constraint, a recursive schema/grammar hole in
        one_shot), FieldConstraintError, ValidatorError (a validator that raised, naming the field), the
        constraint compilers' errors, ProgramError (a request that failed).
    """
    if mode not in MODES:
        raise ValueError(f"fill: mode must be one of {MODES}, got {mode!r}")
    if not isinstance(prompt, str):
        raise TypeError(f"fill: prompt must be text, got {type(prompt).__name__}; decode token ids first")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise FieldConstraintError(f"fill: temperature must be a number >= 0 (0: greedy), got {temperature!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FieldConstraintError(f"fill: seed must be None or an int, got {seed!r}")
    plan = parse_template(template, holes)
    groups = parallel_groups(plan, parallel)
    if groups and mode != "item_by_item":
        raise TemplateError("parallel groups are filled item by item: use mode='item_by_item' (one_shot fills every "
                            "hole in one generation)")
    instructed = [hole.name for hole in plan.holes if hole.constraint.instruction is not None]
    if instructed and mode != "item_by_item":
        raise TemplateError(f"holes {instructed} have an instruction, which item by item filling places before the "
                            "record: use mode='item_by_item' (one_shot makes every field in one generation)")
    for i, hole in enumerate(plan.holes):  # a regex hole that cannot be enforced fails before anything runs
        if isinstance(hole.constraint, Regex):
            guide_for(hole_call(plan, i, temperature, seed), f"hole [{hole.name}]")
    run = RunContext(backend_for(model, tokenizer))
    track = run.new_track()
    track.append_text(prompt + plan.literals[0])
    records: dict[str, CallRecord] = {}
    totals = TokenCounts()
    try:
        start = 0
        if mode == "one_shot":
            one_shot = run_one_shot(run, track, plan, [hole_call(plan, i, temperature, seed)
                                                       for i in range(len(plan.holes))])
            start = one_shot.redo_from
            records.update(one_shot.records)
            totals.add(one_shot.tokens)
        i = start
        while i < len(plan.holes):
            last = groups.get(i, i)
            if last > i or plan.holes[i].constraint.instruction is not None:
                done = _fill_group(run, track, plan, i, last, prompt, temperature, seed, score_choices)
            else:
                done = [_fill_hole(run, track, plan, i, temperature, seed, score_choices)]
            for k, record in zip(range(i, last + 1), done):
                earlier = records.get(plan.holes[k].name)  # the one-shot attempt refused or cut short
                if earlier is not None:
                    record.attempts[:0] = earlier.attempts
                records[plan.holes[k].name] = record
                totals.add(record.tokens)
            i = last + 1
    except BaseException:
        run.abort()
        raise
    finally:
        run.finished = True
        run.release()
    details = {}
    for i, hole in enumerate(plan.holes):
        record = records[hole.name]
        own = record.tokens if record.kind != "one_shot" else TokenCounts()
        details[hole.name] = FilledField(hole.name, track.fields[hole.name], record.value, record.finish_reason,
                                         tuple(record.attempts), record.valid, own)
    return Filled(track.text[len(prompt):], dict(track.fields), details, mode, totals)


def hole_call(plan: TemplatePlan, i: int, temperature: float, seed: int | None) -> GenCall:
    """Hole `i` as a generation followed by the template's next literal (forced in the same request when the
    constraint has a flat regex)."""
    hole = plan.holes[i]
    literal = plan.next_literal(i)
    constraint = hole.constraint
    stop_char = literal[0] if literal else None
    flat = regex_text(constraint, json_string=hole.json_string, stop_char=stop_char, where=f"hole [{hole.name}]")
    if isinstance(constraint, Text) and not literal:
        flat = None  # free text to the end: no constraint at all
    suffix = literal if flat is not None or isinstance(constraint, Text) else ""
    return GenCall(hole.name, constraint.max_tokens, (), constraint if not isinstance(constraint, Text) else None,
                   constraint.validator, constraint.max_retries, temperature, 1.0, seed, suffix, hole.json_string,
                   flat)


def _fill_hole(run: RunContext, track: Track, plan: TemplatePlan, i: int, temperature: float,
               seed: int | None, score_choices: bool) -> CallRecord:
    hole = plan.holes[i]
    literal = plan.next_literal(i)
    if isinstance(hole.constraint, Choices) and score_choices:
        texts = tuple(_json_body(c) for c in hole.constraint.choices) if hole.json_string else None
        record = run_select(run, track, SelectCall(hole.name, hole.constraint.choices, "sum", texts))
        track.append_text(literal)
        return record
    call = hole_call(plan, i, temperature, seed)
    record = run_gen(run, track, call)
    if not call.suffix:
        track.append_text(literal)
    return record


def _fill_group(run: RunContext, track: Track, plan: TemplatePlan, first: int, last: int, prompt: str,
                temperature: float, seed: int | None, score_choices: bool) -> list[CallRecord]:
    """Holes first..last at once, each in a fork of `track` (the text before the group; with the hole's
    instruction after the prompt, when it has one); their texts (value and the literal after) then appended to
    `track` in order, as text."""
    forks = [_fork_for(run, track, plan.holes[k].constraint.instruction, prompt) for k in range(first, last + 1)]
    starts = [len(fork.text) for fork in forks]
    with ThreadPoolExecutor(len(forks), thread_name_prefix="hf_paged-fill") as pool:
        futures = [pool.submit(_fill_hole, run, fork, plan, k, temperature, seed, score_choices)
                   for k, fork in zip(range(first, last + 1), forks)]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.exception() is not None for f in done):
            run.abort()  # the other forks' requests end now
    records = [f.result() for f in futures]
    for k, fork, start in zip(range(first, last + 1), forks, starts):
        track.append_text(fork.text[start:])
        track.fields[plan.holes[k].name] = fork.fields[plan.holes[k].name]
    return records


def _fork_for(run: RunContext, track: Track, instruction: str | None, prompt: str) -> Track:
    """A fork of `track`; with an instruction, a track whose text has it between the prompt and the record (it
    shares the prompt's blocks through the prefix cache)."""
    if instruction is None:
        return run.new_track(track.copy())
    fork = run.new_track()
    fork.append_text(prompt + instruction + "\n" + track.text[len(prompt):])
    return fork


def _json_body(value: str) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)[1:-1]
