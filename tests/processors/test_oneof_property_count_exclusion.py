"""`oneOf` branches told apart by property counts: a branch requiring exactly `maxProperties` keys (or closed with
exactly `minProperties` keys) overlaps the other branch, so exactly-one cannot be checked by a regex: refuse, or
at least never accept a document both branches accept. Checked against `jsonschema` on the boundary documents."""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.errors import UnsupportedSchemaError
from hf_paged.processors.schema import schema_to_regex

jsonschema = pytest.importorskip("jsonschema")

DOCS = ['{}', '{"a":1}', '{"b":1}', '{"a":1,"b":2}', '{"b":1,"a":2}', '{"a":1,"b":2,"c":3}']


def required(*names):
    return {"type": "object", "required": list(names)}


def closed(*names):
    return {"type": "object", "properties": {n: {} for n in names}, "additionalProperties": False}


def counted(**bounds):
    return {"type": "object", "properties": {"a": {}, "b": {}}, **bounds}


# (branch b, branch c, documents the regex must accept: None when the branches overlap, so a refusal is right)
CASES = [
    (required("a"), counted(maxProperties=1), None),  # {"a":1} is valid under both
    (required("a", "b"), counted(maxProperties=1), ['{}', '{"a":1}', '{"b":1}', '{"a":1,"b":2}']),
    (closed("a"), counted(minProperties=1), None),  # {"a":1} again
    (closed("a"), counted(minProperties=2), ['{}', '{"a":1}', '{"a":1,"b":2}']),
]


@pytest.mark.parametrize(("b", "c", "accepted"), CASES)
@pytest.mark.parametrize("flip", [False, True])
def test_oneof_by_property_counts_never_accepts_a_document_of_both_branches(b, c, accepted, flip):
    schema = {"oneOf": [c, b] if flip else [b, c]}
    try:
        rx = schema_to_regex(schema)
    except UnsupportedSchemaError:
        assert accepted is None, "count-disjoint branches are translatable"
        return
    validator = jsonschema.Draft202012Validator(schema)
    for doc in DOCS:  # the regex may leave valid documents out (key order), never let an invalid one in
        if re.fullmatch(rx, doc) is not None:
            assert validator.is_valid(json.loads(doc)), doc
    for doc in accepted or []:
        assert re.fullmatch(rx, doc) is not None, doc
