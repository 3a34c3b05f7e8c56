"""The checks of the schema fuzz (`test_schema_fuzz.py`): one schema compiled to its character-level (byte)
automaton and compared with `jsonschema`'s Draft 2020-12 validator, the reference.

Per schema:
  1. the compile succeeds or raises one of our typed errors (`HfPagedError`), never another exception;
  2. soundness: every document the automaton accepts is valid JSON (no duplicate key that changes the verdict)
     that `jsonschema` validates, formats included: documents drawn by walking the automaton, texts near them
     (`text_mutants`: respelled numbers, `\\u` escapes, bytes edited), and the canonical text of values drawn
     from the schema and near them (`canonical_json`);
  3. completeness: an `UnsatisfiableSchemaError` comes with no valid value among 150 drawn; and a valid drawn value
     is accepted, written canonically, wherever the compiler promises it (`exactness.refusal_expected`).
A problem is a `Finding`; `Tally` counts what was checked, so a test can tell a quiet run from an empty one.
"""

from __future__ import annotations

import enum
import json
import random
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

from hf_paged.errors import HfPagedError, UnsatisfiableSchemaError
from hf_paged.processors.automaton import build_automaton, check_automaton
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.schema import canonical_json, load_schema, schema_to_grammar
from tests.processors.schema_fuzz_exactness import refusal_expected
from tests.processors.schema_fuzz_values import Instances, mutate, text_mutants
from tests.processors.schema_fuzz_walk import Walker

__all__ = ["Finding", "Tally", "Validator", "fuzz_schema"]

jsonschema = pytest.importorskip("jsonschema")
Validator = jsonschema.Draft202012Validator
# The formats asserted: jsonschema checks more where optional packages are installed (`uri` with rfc3987, `duration`
# with isoduration, `hostname` with fqdn, ...), so a fixed list keeps the verdicts the same on a machine that has
# them; one with fewer of these checkers asserts fewer (those it lacks pass every string)
_FORMATS = ("date", "date-time", "email", "idn-email", "idn-hostname", "ipv4", "ipv6", "json-pointer", "regex",
            "relative-json-pointer", "time", "uuid")
FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checkers = {name: Validator.FORMAT_CHECKER.checkers[name] for name in _FORMATS
                    if name in Validator.FORMAT_CHECKER.checkers}

# Work per schema (counts, as in the fuzz that found last session's bugs)
NUM_WALKS = 40
WALK_STEPS = [0, 3, 10, 25, 60, 120]
NUM_DRAWN = 60  # values drawn from the schema
NUM_MUTATED = 30  # values near drawn or accepted ones
NUM_TEXT_ROUNDS = 120  # texts near accepted ones: rounds of `text_mutants`
NUM_UNSAT_DRAWS = 150  # values drawn to disprove an `UnsatisfiableSchemaError`


@dataclass(slots=True)
class Finding:
    """One disagreement with `jsonschema`, or a crash."""

    kind: str  # "crash", "false accept", "false refusal", "dead end", ...
    seed: int
    schema: Any
    text: str  # the document, instance (as JSON) or exception concerned
    detail: str = ""  # jsonschema's first errors, or what went wrong

    def __str__(self) -> str:
        schema = json.dumps(self.schema, ensure_ascii=True)
        return f"seed {self.seed}: {self.kind}: {self.text[:300]!r} {self.detail[:300]}\n  schema: {schema[:1500]}"


@dataclass(slots=True)
class Tally:
    """What the checks covered."""

    schemas: int = 0  # schemas tried (valid under the meta-schema)
    undecidable: int = 0  # jsonschema recursed without end on them: their checks dropped
    compiled: int = 0
    refused: int = 0  # typed errors (unsupported, unsatisfiable, over budget, ...)
    documents: int = 0  # documents drawn from automata, each checked for soundness
    instances: int = 0  # drawn values written canonically and tried on the automaton
    refusals_checked: int = 0  # valid ones where a refusal is a finding (completeness)
    mutants_accepted: int = 0  # texts near accepted ones that the automaton accepts, each checked
    findings: list[Finding] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in ("schemas", "undecidable", "compiled", "refused", "documents", "instances", "refusals_checked",
                     "mutants_accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.findings += other.findings


_NOTHING = object()  # no value (None is JSON's null)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    if len({k for k, _ in pairs}) != len(pairs):
        raise _DuplicateKey
    return dict(pairs)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Undecidable(Exception):
    """jsonschema recursed without end (a `$ref` loop that consumes nothing): no reference for this schema."""


def _valid(validator: Any, value: Any) -> bool:
    try:
        return validator.is_valid(value)
    except RecursionError:
        raise _Undecidable from None


def _errors(validator: Any, value: Any) -> str:
    return "; ".join(e.message for e in list(validator.iter_errors(value))[:3])


class Verdict(enum.Enum):
    """jsonschema's verdict on a value, formats asserted or not."""

    VALID = "valid"
    BAD_FORMAT = "valid but for a format"  # we enforce every format we support: a finding where we accept it
    INVALID = "invalid"


@dataclass(slots=True)
class _Run:
    """The checks of one compiled schema."""

    seed: int
    schema: Any
    walker: Walker
    validator: Any  # formats not asserted (what jsonschema does by default)
    with_formats: Any  # formats asserted: we enforce every format we support
    warned: bool  # the compile warned (a try left something out): completeness is not promised
    rng: random.Random
    tally: Tally

    def find(self, kind: str, text: str, detail: str = "") -> None:
        self.tally.findings.append(Finding(kind, self.seed, self.schema, text, detail))

    def accepts(self, text: str) -> bool:
        return self.walker.dfa.accepts(text.encode("utf-8", "surrogatepass"))

    def verdict(self, value: Any) -> Verdict:
        """jsonschema's verdict, formats asserted first (most values pass: one validation)."""
        if _valid(self.with_formats, value):
            return Verdict.VALID
        return Verdict.BAD_FORMAT if _valid(self.validator, value) else Verdict.INVALID

    def find_invalid(self, kind: str, text: str, verdict: Verdict, value: Any) -> None:
        validator = self.validator if verdict is Verdict.INVALID else self.with_formats
        suffix = " (format)" if verdict is Verdict.BAD_FORMAT else ""
        self.find(kind + suffix, text, _errors(validator, value))

    def check_accepted(self, text: str, kind: str) -> Any:
        """Check a document the automaton accepts; return its value, or `_NOTHING` (invalid, or a duplicate key)."""
        try:
            value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_not_json)
        except _DuplicateKey:
            last, first = json.loads(text), json.loads(text, object_pairs_hook=lambda ps: dict(reversed(ps)))
            if not (_valid(self.validator, last) and _valid(self.validator, first)):
                self.find("duplicate key changes the verdict", text)
            return _NOTHING
        except ValueError as exc:
            self.find("not JSON", text, str(exc))
            return _NOTHING
        verdict = self.verdict(value)
        if verdict is not Verdict.VALID:
            self.find_invalid(kind, text, verdict, value)
            return _NOTHING
        return value

    def walk(self) -> list[tuple[str, Any]]:
        """Documents drawn from the automaton, each checked; the valid ones as (text, value)."""
        accepted = []
        for _ in range(NUM_WALKS):
            sample = self.walker.sample(self.rng, self.rng.choice(WALK_STEPS))
            if sample.dead_end is not None:
                self.find("dead end", sample.dead_end.decode("utf-8", "replace"))
                break
            if sample.text is None:
                continue
            self.tally.documents += 1
            try:
                text = sample.text.decode("utf-8")
            except UnicodeDecodeError:
                self.find("not UTF-8", repr(sample.text))
                continue
            value = self.check_accepted(text, "false accept")
            if value is not _NOTHING:
                accepted.append((text, value))
        return accepted

    def candidates(self, accepted: list[tuple[str, Any]]) -> list[Any]:
        """Values drawn from the schema, values near them and near accepted ones, and the accepted ones."""
        draw = Instances(self.rng, self.schema)
        drawn = [v for v in (_draw(draw, self.schema) for _ in range(NUM_DRAWN)) if v is not _NOTHING]
        base = [v for _, v in accepted] + drawn[:10]
        for _ in range(NUM_MUTATED):
            if base:
                try:
                    drawn.append(mutate(self.rng, self.rng.choice(base)))
                except RecursionError:
                    pass
        return drawn + [v for _, v in accepted]

    def instances(self, values: list[Any]) -> list[str]:
        """Write each value canonically and try it; return the valid ones' texts."""
        seen, valid_texts = set(), []
        for value in values:
            key = json.dumps(value)
            if key in seen:
                continue
            seen.add(key)
            verdict = self.verdict(value)
            try:
                text = canonical_json(self.schema, value)
            except Exception as exc:  # noqa: BLE001 -- a crash of the writer is a finding
                self.find("canonical_json crashed", key, f"{type(exc).__name__}: {exc}")
                continue
            if text is None:  # (no JSON text: NaN, infinity)
                continue
            self.tally.instances += 1
            accepted = self.accepts(text)
            if verdict is not Verdict.INVALID:
                valid_texts.append(text)  # (valid as jsonschema reads it by default: texts near it are tried)
            if accepted and verdict is not Verdict.VALID:
                self.find_invalid("false accept (instance)", text, verdict, value)
            elif verdict is Verdict.VALID:
                self.check_refusal(text, value, accepted)
        return valid_texts

    def check_refusal(self, text: str, value: Any, accepted: bool) -> None:
        """A valid value is accepted, unless a refusal is expected: the compile warned (a try left something out),
        or a documented subset covers it (`refusal_expected`)."""
        if self.warned or refusal_expected(self.schema, value) is not None:
            return
        self.tally.refusals_checked += 1
        if not accepted:
            self.find("false refusal", text)

    def mutants(self, texts: list[str]) -> None:
        """Texts near accepted ones: every one the automaton accepts is checked."""
        if not texts:
            return
        seen = set(texts)
        for _ in range(NUM_TEXT_ROUNDS):
            for mutant in text_mutants(self.rng, self.rng.choice(texts)):
                if mutant in seen:
                    continue
                seen.add(mutant)
                try:
                    data = mutant.encode("utf-8")
                except UnicodeEncodeError:  # (a lone surrogate)
                    continue
                if self.walker.dfa.accepts(data):
                    self.tally.mutants_accepted += 1
                    self.check_accepted(mutant, "false accept (mutant)")


def _draw(draw: Instances, schema: Any) -> Any:
    try:
        return draw.value(schema)
    except RecursionError:  # (a deep `$ref` loop in the drawing)
        return _NOTHING


def _compile(schema: Any) -> tuple[Any, bool]:
    """The schema's automaton as the processors build it, and whether the compile warned."""
    budget = CompileBudget()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_schema(schema, budget)
        regex = schema_to_grammar(loaded, strict=True, budget=budget)
        check_automaton(regex, budget.for_automaton())
        dfa = build_automaton(regex)
    return dfa, bool(caught)


def fuzz_schema(seed: int, schema: Any) -> Tally:
    """Compile `schema` and run every check on it (the draws seeded from `seed`). A schema that jsonschema cannot
    decide (its `$ref` loop recurses without end) counts as `undecidable`, its checks dropped."""
    tally = Tally()
    try:
        Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return tally
    tally.schemas = 1
    try:
        _fuzz_compiled(seed, schema, tally)
    except _Undecidable:
        tally.undecidable = 1
    return tally


def _fuzz_compiled(seed: int, schema: Any, tally: Tally) -> None:
    rng = random.Random(seed * 7919 + 1)
    with_formats = Validator(schema, format_checker=FORMATS)
    try:
        dfa, warned = _compile(schema)
    except HfPagedError as exc:
        tally.refused = 1
        if isinstance(exc, UnsatisfiableSchemaError):
            _check_unsatisfiable(seed, schema, str(exc), with_formats, rng, tally)
        return
    except Exception as exc:  # noqa: BLE001 -- any other exception is the finding
        tally.findings.append(Finding("crash", seed, schema, f"{type(exc).__name__}: {exc}"))
        return
    tally.compiled = 1
    run = _Run(seed, schema, Walker(dfa), Validator(schema), with_formats, warned, rng, tally)
    try:
        accepted = run.walk()
        valid_texts = run.instances(run.candidates(accepted))
        run.mutants([t for t, _ in accepted] + valid_texts)
    except _Undecidable:
        raise
    except Exception as exc:  # noqa: BLE001 -- walking a compiled automaton must not raise
        run.find("crash while walking", f"{type(exc).__name__}: {exc}")


def _check_unsatisfiable(seed: int, schema: Any, message: str, validator: Any, rng: random.Random,
                         tally: Tally) -> None:
    """A schema refused as unsatisfiable has no valid value among those drawn from it (formats asserted: we
    enforce them). Except where a schema without `type` is read as its keywords' types (documented:
    `{"items": false, "minItems": 2}` allows no array, though every non-array is valid): the error says so in its
    text alone, hence the match on it (a reworded message makes this check fail, never pass silently)."""
    draw = Instances(rng, schema)
    for _ in range(NUM_UNSAT_DRAWS):
        value = _draw(draw, schema)
        if value is not _NOTHING and _valid(validator, value):
            if "without `type`" not in message:
                tally.findings.append(Finding("unsatisfiable, yet valid", seed, schema, json.dumps(value), message))
            return
