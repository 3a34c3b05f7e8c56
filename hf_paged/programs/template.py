"""Templates with named holes, compiled to forced literal text and one hole per field.

    '{"intent": "[intent]", "tags": ["[t1]", "[t2]"]}'
      literals: '{"intent": "'  '", "tags": ["'  '", "'  '"]}'
      holes:    intent (between quotes: a JSON string body)   t1   t2

A hole is `[name]` (a Python identifier). Any other bracket is literal text (`["` above); write `[[` and `]]` for
a literal `[` or `]` where the text would read as a hole (`[[true]]` is the literal `[true]`). A hole between two
double quotes is a JSON string: its value is a JSON string body (escaped, never an unescaped quote).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hf_paged.programs.constraints import Constraint, GrammarText, Regex, Schema, as_constraint
from hf_paged.programs.errors import TemplateError
from hf_paged.programs.hole_regex import inner_anchors, strip_end_anchors

__all__ = ["Hole", "TemplatePlan", "parse_template"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Hole:
    """One field of a template: its name, constraint, and whether it sits between quotes (a JSON string)."""

    name: str
    constraint: Constraint
    json_string: bool
    column: int  # where `[name]` starts in the template (for messages)


@dataclass(frozen=True, slots=True)
class TemplatePlan:
    """`literals[i]` comes before `holes[i]`; `literals[-1]` after the last hole (len(literals) = len(holes) + 1)."""

    literals: tuple[str, ...]
    holes: tuple[Hole, ...]

    def next_literal(self, i: int) -> str:
        return self.literals[i + 1]


def parse_template(template: str, constraints: dict[str, Any]) -> TemplatePlan:
    """Split `template` into literals and holes and give each hole its constraint from `constraints` (hole name ->
    a list of choices or an `hp.text` / `hp.regex` / `hp.schema` / `hp.grammar` value).

    Raises:
        TemplateError: not a string, no hole, an unbalanced hole (`[name` without `]`, or `name]` without `[`),
            a name used twice, a hole without a constraint, a constraint for no hole, a schema or grammar hole
            between quotes, a regex with an anchor inside it (anchors at its ends mean the hole's ends).
        FieldConstraintError: a constraint that is not one.
    """
    if not isinstance(template, str):
        raise TemplateError(f"the template must be a string with [name] holes, got {type(template).__name__}")
    literals, names = _split(template)
    if not names:
        raise TemplateError("the template has no hole: mark each field as [name], e.g. '{\"intent\": \"[intent]\"}'")
    seen: dict[str, int] = {}
    for name, column in names:
        if name in seen:
            raise TemplateError(f"hole [{name}] appears twice (columns {seen[name]} and {column}); give each hole its "
                                f"own name (e.g. [{name}_2])")
        seen[name] = column
    unknown = sorted(set(constraints) - set(seen))
    if unknown:
        raise TemplateError(f"constraints given for {unknown} but the template has no such hole; its holes: "
                            f"{list(seen)}")
    holes = []
    for i, (name, column) in enumerate(names):
        if name not in constraints:
            raise TemplateError(f"hole [{name}] has no constraint: pass {name}=[...choices] or "
                                f"{name}=hp.text(max_tokens=...) (or hp.regex / hp.schema / hp.grammar)")
        json_string = literals[i].endswith('"') and literals[i + 1].startswith('"')
        constraint = as_constraint(f"hole [{name}]", constraints[name])
        if json_string and isinstance(constraint, (Schema, GrammarText)):  # its text would land in the string raw
            kind = "hp.schema writes a whole JSON value (a string with its own quotes)" if isinstance(
                constraint, Schema) else "hp.grammar's text is not escaped as a JSON string"
            raise TemplateError(f"hole [{name}] sits between quotes (a JSON string body) but {kind}: put the hole "
                                f"outside the quotes ({{\"{name}\": [{name}]}}), or use hp.regex / hp.text / choices "
                                "for a string")
        if isinstance(constraint, Regex):
            _check_anchors(name, constraint.pattern)
        holes.append(Hole(name, constraint, json_string, column))
    return TemplatePlan(tuple(literals), tuple(holes))


def _check_anchors(name: str, pattern: str) -> None:
    """A hole's value is matched whole: anchors at the pattern's ends mean its ends (`strip_end_anchors`); one left
    inside (in a group, under a repetition) would hold only at the ends of the whole generation, silently
    dropping the alternatives that hold it."""
    inside = inner_anchors(strip_end_anchors(pattern))
    if inside:
        anchor, position = inside[0]
        raise TemplateError(
            f"hole [{name}]: the regex {pattern!r} has the anchor {anchor!r} inside it (position {position} once the "
            "anchors at its ends are dropped); a hole's value is matched whole, so anchors mean its ends only at the "
            "pattern's start or end, outside groups: move it there or remove it (e.g. '(?:a|b)$' -> 'a|b')")


def _split(template: str) -> tuple[list[str], list[tuple[str, int]]]:
    literals, names, current, i = [], [], [], 0
    while i < len(template):
        char = template[i]
        if template.startswith("[[", i) or template.startswith("]]", i):
            current.append(char)
            i += 2
            continue
        if char == "[":
            match = _NAME.match(template, i + 1)
            if match is not None:
                end = match.end()
                if end < len(template) and template[end] == "]":
                    literals.append("".join(current))
                    current = []
                    names.append((match.group(), i))
                    i = end + 1
                    continue
                raise TemplateError(
                    f"unbalanced hole at column {i}: '[{match.group()}' has no closing ']'; close it "
                    f"('[{match.group()}]'), or write '[[' for a literal '['"
                )
        if char == "]":
            start = i
            while start > 0 and (template[start - 1].isalnum() or template[start - 1] == "_"):
                start -= 1
            word = template[start:i]
            if _NAME.fullmatch(word) and (start == 0 or template[start - 1] != "["):
                raise TemplateError(
                    f"unbalanced hole at column {i}: '{word}]' has no opening '['; open it ('[{word}]'), or write "
                    "']]' for a literal ']'"
                )
        current.append(char)
        i += 1
    literals.append("".join(current))
    return literals, names


def parallel_groups(plan: TemplatePlan, groups: Any) -> dict[int, int]:
    """`fill(parallel=[["s1", "s2"], ...])` as {index of a group's first hole: index of its last}. Each group names
    two or more consecutive holes, each hole in one group at most."""
    if isinstance(groups, str) or not isinstance(groups, list | tuple):
        raise TemplateError(f"parallel must be a list of groups of hole names, e.g. [['s1', 's2']], got {groups!r}")
    index = {hole.name: i for i, hole in enumerate(plan.holes)}
    spans: dict[int, int] = {}
    taken: set[str] = set()
    for group in groups:
        names = [group] if isinstance(group, str) else list(group)
        unknown = [n for n in names if n not in index]
        if unknown or len(names) < 2:
            raise TemplateError(f"parallel group {group!r}: give two or more of the template's holes "
                                f"{list(index)}" + (f"; unknown: {unknown}" if unknown else ""))
        positions = sorted(index[n] for n in names)
        if positions != list(range(positions[0], positions[0] + len(positions))):
            raise TemplateError(f"parallel group {group!r}: its holes must follow each other in the template (a "
                                "hole between them would see some of their values and not others)")
        if taken & set(names):
            raise TemplateError(f"parallel group {group!r}: {sorted(taken & set(names))} already in another group")
        taken.update(names)
        spans[positions[0]] = positions[-1]
    return spans
