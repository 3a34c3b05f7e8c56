"""Schema sets for the wide compile benchmark (`json_schema_wide.py`): each set is a list of (name, schema, tests),
`tests` the instances `[{"data", "valid"}]` where the source has them (else empty).

    maskbench    the MaskBench sample of `shared/data/schemas` (the set the speed work was tuned on)
    suite        every distinct schema of JSON-Schema-Test-Suite draft 2020-12 (its top-level files)
    schemastore  a seeded sample of a directory of real-world schemas (SchemaStore's `src/schemas/json`)
    stress       generated (`stress_schemas`, seeded): many optional properties, string-or-array and
                 anyOf/oneOf unions, `$ref` fan-out and deep chains, free-form objects, manifest-like mixes

None of the schemas are committed: the suite comes from the `jsonschema` sdist, SchemaStore from its repository
(see `json_schema_wide.py`'s docstring); the stress set is generated the same way on every run.
"""

from __future__ import annotations

import glob
import json
import os
import random

__all__ = ["maskbench", "schemastore", "stress_schemas", "suite"]


Named = list[tuple[str, object, list]]


def maskbench(directory: str) -> Named:
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as handle:
            spec = json.load(handle)
        out.append((os.path.basename(path)[: -len(".json")], spec["schema"], spec.get("tests", [])))
    return out


def suite(directory: str) -> Named:
    """Each distinct schema of the suite's top-level files, named `file#group`."""
    out, seen = [], set()
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as handle:
            groups = json.load(handle)
        for k, group in enumerate(groups):
            text = json.dumps(group["schema"], sort_keys=True)
            if text not in seen:
                seen.add(text)
                out.append((f"{os.path.basename(path)[:-5]}#{k}", group["schema"], group["tests"]))
    return out


def schemastore(directory: str, size: int = 300, seed: int = 0) -> Named:
    """`size` schemas drawn with `seed` from the files sorted by name (unreadable JSON skipped before drawing)."""
    readable = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(path, encoding="utf-8") as handle:
                readable.append((os.path.basename(path)[:-5], json.load(handle), []))
        except (ValueError, UnicodeDecodeError):
            continue
    picked = sorted(random.Random(seed).sample(range(len(readable)), min(size, len(readable))))
    return [readable[k] for k in picked]


# -- generated stress schemas ----------------------------------------------------------------------------------
_SCALARS = [
    {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
    {"type": "string", "maxLength": 40}, {"type": "integer", "minimum": 0},
    {"type": "string", "enum": ["a", "bb", "ccc"]}, {"type": "string", "format": "uri"},
]


def _value(rng: random.Random, depth: int) -> dict:
    kind = rng.random()
    if depth <= 0 or kind < 0.5:
        return dict(rng.choice(_SCALARS))
    if kind < 0.65:
        return {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    if kind < 0.75:
        return {"type": "object"}  # free-form
    if kind < 0.85:
        return {"type": "object", "additionalProperties": {"type": "string"}}
    return {"type": "array", "items": _value(rng, depth - 1)}


def _optional_object(rng: random.Random, num: int, depth: int = 1) -> dict:
    props = {f"p{k}_{rng.randrange(1000)}": _value(rng, depth) for k in range(num)}
    required = sorted(rng.sample(sorted(props), min(2, num)))
    return {"type": "object", "properties": props, "required": required}


def _unions(rng: random.Random, num: int, one_of: bool) -> dict:
    branches = [_optional_object(rng, rng.randint(2, 6), 0) for _ in range(num)]
    return {"oneOf" if one_of else "anyOf": branches}


def _ref_fan_out(rng: random.Random, num_defs: int, fan: int) -> dict:
    defs = {}
    for k in range(num_defs):
        props = {f"f{j}": dict(rng.choice(_SCALARS)) for j in range(rng.randint(1, 4))}
        for j in range(fan):  # refs to later definitions only: a DAG, shared many times over
            if k + 1 + j < num_defs:
                props[f"r{j}"] = {"$ref": f"#/$defs/d{rng.randrange(k + 1, num_defs)}"}
        defs[f"d{k}"] = {"type": "object", "properties": props}
    return {"$defs": defs, "type": "object",
            "properties": {f"top{j}": {"$ref": f"#/$defs/d{j}"} for j in range(min(fan * 2, num_defs))}}


def _ref_chain(length: int, recursive: bool) -> dict:
    defs = {f"c{k}": {"type": "object", "properties": {"v": {"type": "integer"},
                                                        "next": {"$ref": f"#/$defs/c{k + 1}"}}}
            for k in range(length)}
    defs[f"c{length}"] = {"$ref": "#/$defs/c0"} if recursive else {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/c0"}


def _manifest(rng: random.Random, num: int) -> dict:
    """A package-manifest-like schema: many optional properties, `$ref`s, string-or-array unions, free-form maps."""
    defs = {
        "person": {"anyOf": [{"type": "string"}, {"type": "object", "properties": {
            "name": {"type": "string"}, "email": {"type": "string"}, "url": {"type": "string"}}}]},
        "deps": {"type": "object", "additionalProperties": {"type": "string"}},
        "strings": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "free": {"type": "object"},
    }
    choices = [{"$ref": "#/$defs/person"}, {"$ref": "#/$defs/deps"}, {"$ref": "#/$defs/strings"},
               {"$ref": "#/$defs/free"}, {"type": "array", "items": {"$ref": "#/$defs/person"}}]
    props = {f"k{k}": dict(rng.choice(choices + _SCALARS)) for k in range(num)}
    return {"$defs": defs, "type": "object", "properties": props, "required": ["k0"]}


def stress_schemas(seed: int = 0, per_kind: int = 10) -> Named:
    rng = random.Random(seed)
    out: list[tuple[str, object]] = []
    for k in range(per_kind):
        num = [10, 20, 30, 50, 75, 100, 125, 150, 175, 200][k % 10]
        out.append((f"optional_{num}_{k}", _optional_object(rng, num)))
        out.append((f"anyof_{k}", _unions(rng, 2 + k, one_of=False)))
        out.append((f"oneof_{k}", _unions(rng, 2 + k % 6, one_of=True)))
        out.append((f"ref_fan_{k}", _ref_fan_out(rng, 5 + 3 * k, 1 + k % 4)))
        out.append((f"ref_chain_{k}", _ref_chain(2 + 3 * k, recursive=k % 2 == 1)))
        out.append((f"manifest_{num}_{k}", _manifest(rng, num)))
    return [(name, schema, []) for name, schema in out]
