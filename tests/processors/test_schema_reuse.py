"""Reused translations (`schema/reuse.py`): a sub-schema translated once per reference-stack state gives the very
texts that translating it at every use gives, in every try of the ladder, and does less work."""

from __future__ import annotations

import contextlib
import json
import os
import random
import warnings

import pytest

from hf_paged.errors import SchemaTooComplexError, UnsatisfiableSchemaError, UnsupportedSchemaError
from hf_paged.processors.automaton import Grammar
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.schema import reuse, schema_to_grammar, schema_to_regex, translate

_SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "schemas")


def _outcome(compile_, schema: dict, **kwargs) -> tuple[object, int | None]:
    """((the texts, or the error's class and message; the warnings), the visits spent, but where the budget ran
    out: a reused translation counts its visits at once, past the limit by more)."""
    budget = CompileBudget()
    with warnings.catch_warnings(record=True) as caught:  # (what a try left out: how many members, `num_pruned`)
        warnings.simplefilter("always")
        try:
            out = compile_(schema, budget=budget, **kwargs)
            texts = (out.root, out.texts) if isinstance(out, Grammar) else out
        except (SchemaTooComplexError, UnsatisfiableSchemaError, UnsupportedSchemaError) as exc:
            texts = (type(exc).__name__, str(exc))
    return (texts, [str(w.message) for w in caught]), None if budget.exhausted() else budget.visits


@contextlib.contextmanager
def _counting():
    """`[n]`: the sub-schemas translated (`translate._plain` calls) inside the block."""
    count = [0]
    plain = translate._plain

    def counted(*args):
        count[0] += 1
        return plain(*args)

    translate._plain = counted
    try:
        yield count
    finally:
        translate._plain = plain


@pytest.fixture
def no_reuse(monkeypatch):
    """Translations never reused: `Reach.build` leaves the index empty (what a reference it cannot resolve does)."""

    def build(self, ctx):
        self.built = True

    def turn_off():
        monkeypatch.setattr(reuse.Reach, "build", build)

    return turn_off


def _random_schema(rng: random.Random) -> dict:
    """Definitions that name each other from `anyOf` options, items, members and `allOf`s (recursion among them),
    with enums, bounds and required members: what makes a node's translation depend on the reference stack."""
    names = [f"d{i}" for i in range(rng.randint(2, 5))]

    def ref() -> dict:
        return {"$ref": f"#/$defs/{rng.choice(names)}"}

    def value(depth: int) -> dict:
        leaves = [{"type": "string"}, {"enum": ["a", "b", 3]}, {"type": "integer", "minimum": 0, "maximum": 9},
                  {"type": "boolean"}, {}]
        if depth > 1:
            return rng.choice(leaves)
        return rng.choice([
            ref(), ref(), {"anyOf": [ref(), ref(), rng.choice(leaves)]}, {"type": "array", "items": ref(),
                                                                          "maxItems": rng.randint(1, 3)},
            {"anyOf": [ref(), {"type": "object", "properties": {"x": value(depth + 1)}}]},
            {"allOf": [ref(), {"required": ["p0"]}]}, {"oneOf": [ref(), {"type": "null"}]}, rng.choice(leaves),
        ])

    defs = {}
    for name in names:
        props = {f"p{j}": value(0) for j in range(rng.randint(1, 3))}
        defs[name] = {"type": "object", "properties": props,
                      "required": rng.sample(sorted(props), rng.randint(0, len(props)))}
        if rng.random() < 0.3:
            defs[name]["additionalProperties"] = False
    return {"$defs": defs, "anyOf": [ref() for _ in range(rng.randint(1, 3))]}


@pytest.mark.parametrize("seed", range(6))
def test_reused_translations_write_the_same_texts(seed, no_reuse):
    """Random recursive schemas through both entry points and several recursion limits, with and without reuse."""
    rng = random.Random(seed)
    schemas = [_random_schema(rng) for _ in range(25)]
    runs = [(schema_to_grammar, {}), (schema_to_regex, {"max_ref_depth": 2}), (schema_to_regex, {"max_cost": 3000})]
    with _counting() as plain:
        reused = [_outcome(compile_, schema, **kwargs) for schema in schemas for compile_, kwargs in runs]
    no_reuse()
    with _counting() as fresh_plain:
        fresh = [_outcome(compile_, schema, **kwargs) for schema in schemas for compile_, kwargs in runs]
    assert reused == fresh  # (the texts or errors, and the visits the budget counted: a reused one counts again)
    assert plain[0] < fresh_plain[0] * 0.9  # (reuse happened: fewer sub-schemas translated)


def test_a_schema_whose_definitions_name_each_other_translates_each_node_about_once(no_reuse):
    """MaskBench's Github_ultra---o69209 (CWL: 46 definitions, option lists of references to each other): 4,157
    visits in its tries before, each node ~4x; the same grammar with reuse from well under half of that."""
    path = os.path.join(_SHARED, "Github_ultra---o69209.json")
    if not os.path.exists(path):
        pytest.skip("shared/data/schemas is not here")
    with open(path) as handle:
        schema = json.load(handle)["schema"]
    with _counting() as plain:
        outcome = _outcome(schema_to_grammar, schema)
    no_reuse()
    with _counting() as fresh_plain:
        assert _outcome(schema_to_grammar, schema) == outcome
    assert isinstance(outcome[0][0][1], tuple) and len(outcome[0][0][1]) > 10  # (a grammar: its root and rules)
    assert plain[0] < fresh_plain[0] / 3


def test_references_that_do_not_resolve_here_turn_reuse_off_and_keep_their_errors():
    """A reference outside the document: the compile is not indexed, and the error is the one it always was."""
    schema = {"anyOf": [{"$ref": "other.json#/x"}, {"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "string"}}}
    with pytest.raises(UnsupportedSchemaError, match="points outside this schema"):
        schema_to_grammar(schema)
    with pytest.warns(UserWarning, match="points outside this schema"):
        assert schema_to_grammar(schema, strict=False)
