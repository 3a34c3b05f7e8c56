"""The calls a program appends to its state: `gen` (generate a field), `select` (score choices), and the
expressions `"text" + gen(...) + "more"` that chain them with literal text, in order.

    s += "Intent: " + hp.select("intent", ["billing", "other"]) + "\\n"    # one Expr: text, Select, text
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hf_paged.programs.constraints import Constraint, Text, check_field_options, choices_of
from hf_paged.programs.errors import FieldConstraintError

__all__ = ["Expr", "GenCall", "SelectCall", "gen", "parts_of", "select"]


class _Chainable:
    """`+` with text or other calls builds an `Expr` (left to right)."""

    __slots__ = ()

    def __add__(self, other: Any) -> Expr:
        return Expr(parts_of(self) + parts_of(other))

    def __radd__(self, other: Any) -> Expr:
        return Expr(parts_of(other) + parts_of(self))


@dataclass(frozen=True, slots=True)
class GenCall(_Chainable):
    """Generate field `name`: at most `max_tokens` tokens, cut at the first `stop` string (not kept), held to
    `constraint` (None: free text). `suffix`: literal text the constraint forces right after the field (a
    template's next literal, produced by jump-forward in the same request; not part of the value)."""

    name: str
    max_tokens: int
    stop: tuple[str, ...] = ()
    constraint: Constraint | None = None
    validator: Callable[[str], bool] | None = None
    max_retries: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    suffix: str = ""
    json_string: bool = False  # the field is a JSON string body (a template hole between quotes)
    regex: str | None = field(default=None, repr=False)  # the regex text to enforce, when not the constraint's own
    heal: bool = False  # token healing (`healing.py`): back up the prompt's last token when the field follows text


@dataclass(frozen=True, slots=True)
class SelectCall(_Chainable):
    """Pick field `name` among `choices` by the model's summed log-probability of each whole choice."""

    name: str
    choices: tuple[str, ...]
    normalize: str = "sum"  # "sum": total log-probability; "mean": per token (favours long choices less)
    texts: tuple[str, ...] | None = None  # what each choice appends to the text (default: the choice itself)


@dataclass(frozen=True, slots=True)
class Expr(_Chainable):
    """Text and calls, appended to a state in order."""

    parts: tuple[str | GenCall | SelectCall, ...]


def parts_of(value: Any) -> tuple[str | GenCall | SelectCall, ...]:
    if isinstance(value, Expr):
        return value.parts
    if isinstance(value, str | GenCall | SelectCall):
        return (value,)
    raise TypeError(f"a program state takes text, hp.gen(...), hp.select(...) or their sums, not "
                    f"{type(value).__name__}; convert it with str(...) first")


def _check_name(where: str, name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise FieldConstraintError(f"{where}: the field name must be a non-empty string, got {name!r}")


def gen(name: str, max_tokens: int = 32, stop: str | Sequence[str] | None = None, *, regex: str | None = None,
        schema: Any = None, choices: Sequence[str] | None = None, grammar: str | None = None,
        validator: Callable[[str], bool] | None = None, max_retries: int = 0, temperature: float = 0.0,
        top_p: float = 1.0, seed: int | None = None, heal: bool = False) -> GenCall:
    """Generate field `name` from everything before it (its blocks come from the prefix cache).

    Args:
        name: the field's name (`s[name]` reads the value).
        max_tokens: most tokens generated.
        stop: a string or strings that end the field; the value stops before the first one (it is not kept).
        regex / schema / choices / grammar: at most one constraint (Rust regex; JSON Schema; exact choices,
            generated under a mask, unlike `select` which scores them; Lark EBNF).
        validator: `validator(value) -> bool`, checked when the field closes; with `max_retries`, a refused value
            is regenerated alone from the cached prefix (sampling, with seed + attempt). A validator that raises
            fails the program with `ValidatorError` naming the field.
        temperature, top_p, seed: sampling (temperature 0: greedy, equal to stock greedy `generate`).
        heal: token healing for a free-text field after literal text: the prompt's last token is backed up and the
            first generated token must extend its text (`programs/healing.py`); the value is the text after it.
    """
    _check_name("hp.gen", name)
    given = [k for k, v in (("regex", regex), ("schema", schema), ("choices", choices), ("grammar", grammar))
             if v is not None]
    if len(given) > 1:
        raise FieldConstraintError(f"hp.gen({name!r}): give one constraint, got {' and '.join(given)}")
    check_field_options(f"hp.gen({name!r})", max_tokens, validator, max_retries)
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not isinstance(s, str) or not s for s in stops):
        raise FieldConstraintError(f"hp.gen({name!r}): stop must be a non-empty string or a list of them, got "
                                   f"{stop!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise FieldConstraintError(f"hp.gen({name!r}): temperature must be a number >= 0, got {temperature!r}")
    if not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise FieldConstraintError(f"hp.gen({name!r}): top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FieldConstraintError(f"hp.gen({name!r}): seed must be None or an int, got {seed!r}")
    constraint: Constraint | None = None
    if regex is not None:
        from hf_paged.programs.constraints import regex as make_regex

        constraint = make_regex(regex, max_tokens=max_tokens)
    elif schema is not None:
        from hf_paged.programs.constraints import schema as make_schema

        constraint = make_schema(schema, max_tokens=max_tokens)
    elif choices is not None:
        constraint = choices_of(f"hp.gen({name!r})", choices)
    elif grammar is not None:
        from hf_paged.programs.constraints import grammar as make_grammar

        constraint = make_grammar(grammar, max_tokens=max_tokens)
    return GenCall(name, max_tokens, stops, constraint, validator, max_retries, float(temperature), top_p, seed,
                   heal=bool(heal))


def select(name: str, choices: Sequence[str], *, normalize: str = "sum") -> SelectCall:
    """Pick field `name` among `choices` by scoring, not sampling: each choice's tokens (the choice encoded on its
    own) are scored after the text before it, all choices in one batch over the shared prefix blocks.

    `normalize="sum"` ranks by the summed log-probability (the probability of the whole choice: shorter choices
    are favoured); `"mean"` by the mean per token. Ties go to the earliest choice in the list. The scores are
    recorded in the state's call record (`state.calls`)."""
    _check_name("hp.select", name)
    checked = choices_of(f"hp.select({name!r})", choices)
    if normalize not in ("sum", "mean"):
        raise FieldConstraintError(f"hp.select({name!r}): normalize must be 'sum' or 'mean', got {normalize!r}")
    return SelectCall(name, checked.choices, normalize)


def default_constraint(call: GenCall) -> Constraint:
    return call.constraint if call.constraint is not None else Text(call.max_tokens, None, 0)
