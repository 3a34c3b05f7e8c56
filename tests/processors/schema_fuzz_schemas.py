"""Random JSON Schemas for the differential fuzz of the schema compiler (`test_schema_fuzz.py`), one per seed.

`schema_for(seed)` mixes the keywords the compiler supports, nested 1-3 levels: bounded numbers and strings,
`pattern`/`format`, finite values, `not`, objects (`patternProperties`, `propertyNames`, `dependent*`), arrays
(`prefixItems`, `contains`, `uniqueItems`), `anyOf`/`oneOf` (overlapping options on purpose), `allOf`,
`if`/`then`/`else` (tagged unions too) and `$ref`s, recursive ones among them. `ref_schema_for(seed)` writes objects
whose `$defs` are used from many places and refer to each other (the reuse of a translation within a try).
The same seed gives the same schema on every run.
"""

from __future__ import annotations

import copy
import random
from typing import Any

__all__ = ["FORMAT_SAMPLES", "KEYS", "PATTERN_SAMPLES", "random_value", "ref_schema_for", "schema_for"]

# property names: empty, non-ASCII, astral, a quote, a backslash, a control character
KEYS = ["a", "b", "c", "foo", "", "é", "a b", '"q', "\\", "\u0000", "😀", "aa", "ab", "1", "x", "bar", "A"]
KEY_PATTERNS = ["^a", "b$", "^x+$", "\\d", "^[a-c]$", "é", "^a+$", "o", "^$", "^.$", "[^a]"]
# each `pattern` with strings on both sides of it (the instance generator's picks)
PATTERN_SAMPLES = {
    "^[a-z]+$": ["abc", "z", "", "A", "a1"], "^a": ["a", "abc", "ba", ""], "b$": ["b", "ab", "ba", "éb"],
    "^[0-9]{2,4}$": ["12", "1234", "1", "12345", "0x"], "x": ["x", "axb", "", "y"],
    "^(ab|cd)*$": ["", "ab", "abcd", "ac", "cdab"], "^.$": ["a", "é", "😀", "", "ab", "\n"],
    "^\\d+$": ["1", "123", "", "١٢", "a"], "^[^a]*$": ["", "b", "bca", "é"], "é": ["é", "aéb", "e"],
    "^\\w{1,3}$": ["a", "ab_", "abcd", "é", "_"], "^a?b?$": ["", "a", "b", "ab", "ba"], "^$": ["", "a"],
    "^[a-c]{0,3}$": ["", "abc", "abcd", "d"], "^(?:a|bc)+$": ["a", "bc", "abca", "b", ""],
    "[0-9]": ["1", "a1", "a"], "^\\s*$": ["", " ", "\t\n", "a"], "^[A-Z][a-z]*$": ["A", "Abc", "a", "AB"],
    "^.{2,3}$": ["ab", "abc", "a", "abcd", "é😀"], "a.c": ["abc", "aXc", "ac", "xa\u00e9cx"],
}
STR_PATTERNS = list(PATTERN_SAMPLES)
FORMATS = ["date", "time", "date-time", "email", "uuid", "ipv4", "ipv6", "hostname", "uri", "duration", "myformat",
           "json-pointer", "regex"]
FORMAT_SAMPLES = {
    "date": ["2020-01-01", "2020-02-30", "2000-02-29", "1900-02-29"],
    "time": ["12:00:00Z", "23:59:59+01:00", "25:00:00Z"],
    "date-time": ["2020-01-01T12:00:00Z", "2020-01-01T12:00:00.123+02:00"], "email": ["a@b.co", "x.y@z.org", "bad"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000"], "ipv4": ["1.2.3.4", "256.1.1.1", "01.1.1.1"],
    "ipv6": ["::1", "1:2:3:4:5:6:7:8"], "hostname": ["example.com", "a-b.c"], "uri": ["http://a.b/c", "file:///x"],
    "duration": ["P1D", "PT1H", "P1W"], "myformat": ["anything"], "json-pointer": ["", "/a/b", "/~0"],
    "regex": ["abc", "a b"],
}
SCALARS = [None, True, False, 0, 1, -1, 2, 3, 1.5, -0.5, 0.1, 10, 100, 1.0, 2.0, "", "a", "b", "ab", "é", "1", "null",
           "\u0000", "x\"y", 1e20, -3]
# `oneOf` options that overlap (a value may match two): the compiler must write "exactly one"
OVERLAPPING_ONE_OF = [
    [{"type": "integer"}, {"minimum": 0}],
    [{"type": "string"}, {"maxLength": 2}],
    [{"type": "number", "multipleOf": 2}, {"type": "number", "multipleOf": 3}],
    [{"required": ["a"]}, {"required": ["b"]}],
    [{"type": "object", "properties": {"a": {"const": 1}}}, {"type": "object", "required": ["b"]}],
    [{"enum": [1, 2, "a"]}, {"type": "integer"}],
    [{"type": "string", "minLength": 1}, {"type": "string", "maxLength": 3}, {"const": "ab"}],
    [{"minItems": 1}, {"maxItems": 1}],
    [{"const": None}, {"type": ["null", "boolean"]}, True],
    [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "maxItems": 1}],
    [{"not": {"const": 1}}, {"type": "integer", "maximum": 2}],
    [{"minProperties": 1}, {"properties": {"a": {"type": "string"}}}],
]


def random_value(rng: random.Random, depth: int = 1) -> Any:
    """A small JSON value: a scalar, or an array or object of them (`depth` levels)."""
    r = rng.random()
    if depth > 0 and r < 0.12:
        return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 2))]
    if depth > 0 and r < 0.22:
        return {rng.choice(KEYS[:6]): random_value(rng, depth - 1) for _ in range(rng.randint(0, 2))}
    return copy.deepcopy(rng.choice(SCALARS))


class SchemaGen:
    """Draws sub-schemas by kind (`k_<kind>`); `defs` collects the `$defs` that `$ref`s point to."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.defs: dict[str, Any] = {}

    def schema(self, depth: int) -> Any:
        kinds = ["int", "num", "str", "enum", "const", "bool", "null", "true", "notval", "multi"]
        weights = [6, 6, 7, 4, 2, 1, 1, 1, 3, 2]
        if depth > 0:
            kinds += ["obj", "arr", "anyOf", "oneOf", "allOf", "ifte", "ref", "notany"]
            weights += [12, 8, 3, 5, 2, 5, 3, 1]
        kind = self.rng.choices(kinds, weights)[0]
        return getattr(self, "k_" + kind)(depth)

    # -- leaves
    def k_true(self, depth: int) -> Any:
        return self.rng.choice([True, {}, False, True])

    def k_bool(self, depth: int) -> Any:
        return {"type": "boolean"}

    def k_null(self, depth: int) -> Any:
        return {"type": "null"}

    def bounds(self, s: dict, ints: bool) -> dict:
        rng = self.rng
        pool = ([-10, -3, -1, 0, 1, 2, 3, 5, 7, 10, 100] if ints
                else [-3, -1.5, 0, 0.1, 0.5, 1, 2.5, 10, 100, 0.001, -0.25, 3])
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if rng.random() < 0.3:
                s[key] = rng.choice(pool + ([1.5, 2.5, -0.5] if ints and rng.random() < 0.3 else []))
        if rng.random() < 0.3:
            s["multipleOf"] = rng.choice([2, 3, 5, 10, 0.5, 4] if ints else [2, 3, 5, 10, 0.5, 0.25, 0.1, 1.5, 0.01, 7])
        return s

    def k_int(self, depth: int) -> Any:
        return self.bounds({"type": "integer"}, True)

    def k_num(self, depth: int) -> Any:
        s = self.bounds({"type": "number"}, False)
        if self.rng.random() < 0.1:
            s["not"] = {"type": "integer"}
        return s

    def k_str(self, depth: int) -> Any:
        rng = self.rng
        s: dict[str, Any] = {"type": "string"}
        if rng.random() < 0.35:
            s["minLength"] = rng.randint(0, 3)
        if rng.random() < 0.35:
            s["maxLength"] = rng.randint(0, 5)
        r = rng.random()
        if r < 0.35:
            s["pattern"] = rng.choice(STR_PATTERNS)
        elif r < 0.5:
            s["format"] = rng.choice(FORMATS)
        return s

    def k_enum(self, depth: int) -> Any:
        rng = self.rng
        values = [random_value(rng) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.05:
            values = [f"v{i}" for i in range(rng.randint(50, 300))] + values
        s: dict[str, Any] = {"enum": values}
        r = rng.random()
        if r < 0.2:
            s["type"] = rng.choice(["string", "integer", "number", ["string", "null"], "object", "array"])
        elif r < 0.35:
            s.update(rng.choice([{"minimum": 1}, {"maxLength": 1}, {"minItems": 1}, {"required": ["a"]},
                                 {"not": {"const": rng.choice(values)}}, {"multipleOf": 2}, {"minProperties": 1}]))
        return s

    def k_const(self, depth: int) -> Any:
        s = {"const": random_value(self.rng)}
        if self.rng.random() < 0.2:
            s["type"] = self.rng.choice(["string", "integer", "number", "boolean"])
        return s

    def k_notval(self, depth: int) -> Any:
        """`not` of values (or of a type) beside a base schema."""
        rng = self.rng
        r = rng.random()
        values = [random_value(rng, 0) for _ in range(rng.randint(1, 3))]
        negated: dict[str, Any] = {"const": values[0]} if r < 0.4 else {"enum": values}
        if rng.random() < 0.15:
            negated = {"type": rng.choice(["integer", "string", "null", ["integer", "string"], "number", "object"])}
        base = rng.choice([
            {}, {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": ["string", "integer"]},
            {"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 0, "maximum": 5},
            {"type": "string", "pattern": "^[ab]*$"}, {"type": "boolean"}, {"type": "array", "maxItems": 1},
            {"type": "object", "maxProperties": 1}, {"type": "string", "format": "date"},
            {"type": "number", "multipleOf": 0.5}])
        return {**base, "not": negated}

    def k_multi(self, depth: int) -> Any:
        """Several types, with keywords that bind only some of them."""
        rng = self.rng
        s: dict[str, Any] = {"type": rng.sample(["string", "integer", "number", "null", "boolean", "array", "object"],
                                                rng.randint(2, 3))}
        for key, value in (("minimum", 0), ("maxLength", 2), ("minItems", 1), ("maxProperties", 1),
                           ("multipleOf", 2), ("pattern", "^a"), ("required", ["a"]), ("uniqueItems", True)):
            if rng.random() < 0.15:
                s[key] = value
        return s

    # -- containers
    def k_obj(self, depth: int) -> Any:
        rng = self.rng
        s: dict[str, Any] = {"type": "object"} if rng.random() < 0.8 else {}
        names = rng.sample(KEYS, rng.randint(0, 3))
        if names or rng.random() < 0.3:
            s["properties"] = {n: self.schema(depth - 1) for n in names}
        if rng.random() < 0.5:
            pool = names + rng.sample(KEYS, 1)
            s["required"] = rng.sample(pool, rng.randint(0, min(2, len(pool))))
        r = rng.random()
        if r < 0.3:
            s["additionalProperties"] = False
        elif r < 0.45:
            s["additionalProperties"] = self.schema(depth - 1)
        elif r < 0.5:
            s["additionalProperties"] = True
        if rng.random() < 0.2:
            s["patternProperties"] = {rng.choice(KEY_PATTERNS): self.schema(depth - 1) for _ in range(rng.randint(1, 2))}
        if rng.random() < 0.15:
            s["propertyNames"] = rng.choice([
                {"pattern": rng.choice(KEY_PATTERNS)}, {"maxLength": rng.randint(0, 2)}, {"enum": rng.sample(KEYS, 3)},
                {"const": rng.choice(KEYS)}, {"minLength": 1}, {"not": {"const": rng.choice(KEYS)}}, False])
        if rng.random() < 0.2:
            s["minProperties"] = rng.randint(0, 3)
        if rng.random() < 0.2:
            s["maxProperties"] = rng.randint(0, 3)
        if rng.random() < 0.15:
            a, b = rng.sample(KEYS[:8], 2)
            s["dependentRequired"] = {a: [b]}
        if rng.random() < 0.07:
            a = rng.choice(names or KEYS[:4])
            s["dependentSchemas"] = {a: {"required": [rng.choice(KEYS[:4])]} if rng.random() < 0.5 else
                                     {"properties": {rng.choice(KEYS[:4]): self.schema(0)}}}
        return s

    def k_arr(self, depth: int) -> Any:
        rng = self.rng
        s: dict[str, Any] = {"type": "array"} if rng.random() < 0.85 else {}
        if rng.random() < 0.35:
            s["prefixItems"] = [self.schema(depth - 1) for _ in range(rng.randint(1, 2))]
        r = rng.random()
        if r < 0.55:
            s["items"] = self.schema(depth - 1)
        elif r < 0.65:
            s["items"] = False
        if rng.random() < 0.3:
            s["contains"] = self.schema(depth - 1)
            if rng.random() < 0.4:
                s["minContains"] = rng.randint(0, 2)
            if rng.random() < 0.3:
                s["maxContains"] = rng.randint(1, 2)
        if rng.random() < 0.3:
            s["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.4:
            s["maxItems"] = rng.randint(0, 4)
        if rng.random() < 0.25:
            s["uniqueItems"] = rng.random() < 0.85
        return s

    def k_anyOf(self, depth: int) -> Any:
        return {"anyOf": [self.schema(depth - 1) for _ in range(self.rng.randint(1, 3))]}

    def k_oneOf(self, depth: int) -> Any:
        rng = self.rng
        if rng.random() < 0.5:
            options = copy.deepcopy(rng.choice(OVERLAPPING_ONE_OF))
            if rng.random() < 0.3:
                options.append(self.schema(depth - 1))
            return {"oneOf": options}
        return {"oneOf": [self.schema(depth - 1) for _ in range(rng.randint(1, 3))]}

    def k_allOf(self, depth: int) -> Any:
        return {"allOf": [self.schema(depth - 1) for _ in range(self.rng.randint(1, 2))]}

    def condition(self) -> Any:
        """An `if` condition of the kinds the compiler can negate."""
        rng = self.rng
        k = rng.choice(KEYS[:5])
        return copy.deepcopy(rng.choice([
            {"properties": {k: {"const": random_value(rng, 0)}}, "required": [k]},
            {"properties": {k: {"const": random_value(rng, 0)}}},
            {"properties": {k: {"enum": [random_value(rng, 0), random_value(rng, 0)]}}},
            {"type": "string"}, {"type": "integer"}, {"minimum": rng.choice([0, 3, 1.5])}, {"required": [k]},
            {"enum": [random_value(rng, 0) for _ in range(2)]}, {"maxLength": 2}, {"minItems": 1},
            {"const": random_value(rng, 0)}, {"not": {"type": "null"}}, {"maxProperties": 1},
            {"anyOf": [{"type": "string"}, {"minimum": 2}]}, {"allOf": [{"type": "integer"}, {"maximum": 5}]},
            {"properties": {k: {"type": "integer"}}}, {"exclusiveMaximum": 0}, {"minLength": 1.0},
            {"type": ["integer", "string"]}, {"properties": {k: {"minimum": 2}}, "required": [k]},
            {"not": {"const": random_value(rng, 0)}}, {"multipleOf": 2},
        ]))

    def k_ifte(self, depth: int) -> Any:
        rng = self.rng
        s: dict[str, Any] = {"if": self.condition()}
        if rng.random() < 0.8:
            s["then"] = self.schema(depth - 1)
        if rng.random() < 0.7:
            s["else"] = self.schema(depth - 1)
        if rng.random() < 0.3:
            s["type"] = rng.choice(["object", "string", "integer", ["object", "null"]])
        if rng.random() < 0.2:  # several conditionals on one property (a tagged union)
            k = rng.choice(KEYS[:3])
            s = {"type": "object", "properties": {k: {"enum": ["x", "y", 1]}},
                 "allOf": [{"if": {"properties": {k: {"const": v}}, **({"required": [k]} if rng.random() < 0.5 else {})},
                            "then": self.schema(depth - 1), **({"else": self.schema(0)} if rng.random() < 0.3 else {})}
                           for v in rng.sample(["x", "y", 1, "z"], 2)]}
        return s

    def k_ref(self, depth: int) -> Any:
        rng = self.rng
        if self.defs and rng.random() < 0.4:
            name = rng.choice(list(self.defs))
        else:
            name = f"d{len(self.defs)}"
            self.defs[name] = True  # a placeholder: the definition drawn below may refer to itself
            if rng.random() < 0.2:
                self.defs[name] = self._recursive(name)
            else:
                self.defs[name] = self.schema(depth - 1)
        s: dict[str, Any] = {"$ref": f"#/$defs/{name}"}
        if rng.random() < 0.25:
            s.update(self._beside_ref())
        return s

    def _recursive(self, name: str) -> Any:
        ref = {"$ref": f"#/$defs/{name}"}
        if self.rng.random() < 0.5:
            return {"anyOf": [{"type": "integer"}, {"type": "array", "maxItems": 2, "items": ref}]}
        return {"type": "object", "properties": {"v": {"type": "integer"}, "next": ref}, "additionalProperties": False}

    def _beside_ref(self) -> dict:
        return self.rng.choice([{"type": "object"}, {"maxLength": 2}, {"minimum": 0}, {"required": ["a"]},
                                {"not": {"const": 1}}, {"properties": {"a": {"type": "integer"}}}])

    def k_notany(self, depth: int) -> Any:
        rng = self.rng
        return {"not": rng.choice([{"required": [rng.choice(KEYS[:3])]}, {"not": self.schema(0)},
                                   {"type": rng.choice(["string", "object", "array"])}])}


def schema_for(seed: int) -> Any:
    """The fuzz's schema of `seed`: 1-3 levels deep, its `$defs` (if any) beside it."""
    rng = random.Random(seed)
    gen = SchemaGen(rng)
    s = gen.schema(rng.choice([1, 2, 2, 3]))
    if not gen.defs:
        return s
    if isinstance(s, dict) and "$defs" not in s:
        return {**s, "$defs": gen.defs}
    return {"allOf": [s], "$defs": gen.defs}


class RefGen(SchemaGen):
    """Schemas whose definitions are used from several places and refer to each other."""

    def schema(self, depth: int) -> Any:
        if depth > 0 and self.rng.random() < 0.35:
            return self.k_ref(depth)
        return super().schema(depth)

    def k_ref(self, depth: int) -> Any:
        rng = self.rng
        if self.defs and rng.random() < 0.6:
            name = rng.choice(list(self.defs))
        else:
            name = f"d{len(self.defs)}"
            self.defs[name] = True
            self.defs[name] = self.schema(max(depth - 1, 0) + (1 if rng.random() < 0.3 else 0))
        s: dict[str, Any] = {"$ref": f"#/$defs/{name}"}
        if rng.random() < 0.2:
            s.update(self._beside_ref())
        return s


def ref_schema_for(seed: int) -> Any:
    """An object whose 2-4 properties use shared `$defs` (in place, in `anyOf`/`oneOf`, as array items)."""
    rng = random.Random(seed)
    gen = RefGen(rng)
    shapes = [lambda: gen.k_ref(2), lambda: {"anyOf": [gen.k_ref(1), gen.k_ref(1)]},
              lambda: {"type": "array", "items": gen.k_ref(1), "maxItems": 3},
              lambda: {"oneOf": [gen.k_ref(1), gen.schema(1)]}, lambda: gen.schema(2)]
    props = {k: rng.choice(shapes)() for k in rng.sample(KEYS[:8], rng.randint(2, 4))}
    s: dict[str, Any] = {"type": "object", "properties": props}
    if rng.random() < 0.5:
        s["required"] = rng.sample(list(props), rng.randint(0, len(props)))
    if rng.random() < 0.3:
        s["additionalProperties"] = False
    s["$defs"] = gen.defs
    return s
