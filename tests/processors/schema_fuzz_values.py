"""Instances for the schema fuzz (`test_schema_fuzz.py`): values drawn from a schema's keywords (`Instances`),
values near a given one (`mutate`), and texts near a given JSON text (`text_mutants`).

The values aim at both sides of each keyword: numbers around bounds and multiples, strings from each pattern's
and format's samples on both sides, arrays and objects of about the allowed sizes, branches of `anyOf`/`oneOf`/
`if` merged with their parent. Whether a value is valid is `jsonschema`'s call, never this module's.
"""

from __future__ import annotations

import copy
import math
import random
import re
from typing import Any

from tests.processors.schema_fuzz_schemas import FORMAT_SAMPLES, KEYS, PATTERN_SAMPLES, random_value

__all__ = ["Instances", "mutate", "text_mutants"]

_TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
# keywords that suggest a type when a schema has no `type`
_TYPE_HINTS = [
    ("object", ("properties", "required", "additionalProperties", "minProperties", "patternProperties",
                "propertyNames", "dependentRequired")),
    ("array", ("items", "prefixItems", "contains", "minItems", "maxItems")),
    ("string", ("minLength", "maxLength", "pattern", "format")),
]
_NUMBER_HINTS = ("minimum", "maximum", "multipleOf", "exclusiveMinimum", "exclusiveMaximum")


class Instances:
    """Values drawn for one schema (`root` resolves its `$ref`s), mostly valid, some not."""

    def __init__(self, rng: random.Random, root: Any):
        self.rng = rng
        self.root = root

    def resolve(self, ref: str) -> Any:
        if ref == "#":
            return self.root
        if ref.startswith("#/$defs/") and isinstance(self.root, dict):
            return self.root.get("$defs", {}).get(ref[len("#/$defs/"):], True)
        return True

    def value(self, s: Any, depth: int = 0) -> Any:
        rng = self.rng
        if depth > 6 or rng.random() < 0.04 or not isinstance(s, dict):
            return random_value(rng)
        branch = self._branch(s, depth)
        if branch is not None:
            return branch[0]
        t = s.get("type")
        if isinstance(t, list):
            t = rng.choice(t) if t else None
        if t is None:
            t = self._hinted_type(s)
        if rng.random() < 0.05:
            t = rng.choice(_TYPES)
        return getattr(self, "t_" + t)(s, depth)

    def _branch(self, s: dict, depth: int) -> tuple[Any] | None:
        """A value of a `$ref` target, `const`/`enum` member, or applicator branch merged with `s`, as a 1-tuple
        (the value may be None); None to draw by type instead."""
        rng = self.rng
        if "$ref" in s and rng.random() < 0.85:
            target = self.resolve(s["$ref"])
            if isinstance(target, dict):
                return (self.value({**{k: v for k, v in s.items() if k != "$ref"}, **target}, depth + 1),)
        if "const" in s and rng.random() < 0.8:
            return (copy.deepcopy(s["const"]),)
        if isinstance(s.get("enum"), list) and s["enum"] and rng.random() < 0.85:
            return (copy.deepcopy(rng.choice(s["enum"])),)
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and s[key] and rng.random() < 0.8:
                option = rng.choice(s[key])
                rest = {k: v for k, v in s.items() if k != key}
                if isinstance(option, dict):
                    return (self.value({**rest, **option} if rng.random() < 0.5 else option, depth + 1),)
        if isinstance(s.get("allOf"), list) and s["allOf"] and rng.random() < 0.8:
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for part in s["allOf"]:
                if isinstance(part, dict):
                    for k, v in part.items():
                        merged.setdefault(k, v)
            return (self.value(merged, depth + 1),)
        if "if" in s and rng.random() < 0.8:
            pick = s.get("then") if rng.random() < 0.5 else s.get("else")
            base = {k: v for k, v in s.items() if k not in ("if", "then", "else")}
            if isinstance(pick, dict):
                return (self.value({**base, **pick}, depth + 1),)
            if isinstance(s["if"], dict) and rng.random() < 0.5:
                return (self.value({**base, **s["if"]}, depth + 1),)
        return None

    def _hinted_type(self, s: dict) -> str:
        for t, hints in _TYPE_HINTS:
            if any(k in s for k in hints):
                return t
        if any(k in s for k in _NUMBER_HINTS):
            return self.rng.choice(["integer", "number"])
        return self.rng.choice(_TYPES)

    def t_null(self, s: dict, depth: int) -> Any:
        return None

    def t_boolean(self, s: dict, depth: int) -> Any:
        return self.rng.random() < 0.5

    def _number(self, s: dict, integer: bool) -> Any:
        """A number at or near a bound, a multiple, or 0/1/-1; sometimes a far or odd one (1e21, 2**64-ish)."""
        rng = self.rng
        lo = [s[k] for k in ("minimum", "exclusiveMinimum") if isinstance(s.get(k), (int, float))]
        hi = [s[k] for k in ("maximum", "exclusiveMaximum") if isinstance(s.get(k), (int, float))]
        m = s.get("multipleOf")
        anchor = rng.choice(lo + hi + [0, 1, -1])
        r = rng.random()
        if isinstance(m, (int, float)) and m > 0 and r < 0.6:
            v = (round(anchor / m) + rng.randint(-2, 2)) * m
            if isinstance(m, float):
                v = float(repr(round(v, 10)))
        elif r < 0.8:
            v = anchor + rng.choice([0, 1, -1, 0.5, -0.5, 0.25, 0.001, 2, -2, 10, 1e-7, 1234567])
        else:
            v = rng.choice([0, -0.0, 1e20, 1e21, 12345678901234567890, 0.1, 1e-7, 2.5e-5, 123.456, -7, 1.0, 3.0])
        if integer:
            v = int(math.floor(v)) if not isinstance(v, int) else v
            if rng.random() < 0.1:
                v = float(v)
        return v

    def t_integer(self, s: dict, depth: int) -> Any:
        return self._number(s, True)

    def t_number(self, s: dict, depth: int) -> Any:
        return self._number(s, self.rng.random() < 0.4)

    def t_string(self, s: dict, depth: int) -> Any:
        rng = self.rng
        pattern, fmt = s.get("pattern"), s.get("format")
        if isinstance(fmt, str) and fmt in FORMAT_SAMPLES and rng.random() < 0.8:
            return rng.choice(FORMAT_SAMPLES[fmt])
        if isinstance(pattern, str) and pattern in PATTERN_SAMPLES and rng.random() < 0.8:
            return rng.choice(PATTERN_SAMPLES[pattern])
        if isinstance(pattern, str) and rng.random() < 0.5:
            return rng.choice(KEYS + ["abc", "xyz", "12", "ab", "b", "a", "aXc"])
        lo = s.get("minLength", 0) if isinstance(s.get("minLength"), int) else 0
        hi = s.get("maxLength", lo + 4) if isinstance(s.get("maxLength"), int) else lo + 4
        n = rng.randint(min(lo, hi), max(lo, hi)) if rng.random() < 0.9 else rng.randint(0, 6)
        odd = "abcxyz019 é_-\"\\/\n\t\u0000😀\u2028A\u007f\u0080"  # escapes, controls, non-ASCII, astral
        return "".join(rng.choice(odd if rng.random() < 0.3 else "abcxy01") for _ in range(n))

    def t_array(self, s: dict, depth: int) -> Any:
        rng = self.rng
        prefix = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else []
        items = s.get("items", True)
        lo = s.get("minItems", 0) if isinstance(s.get("minItems"), int) else 0
        default_hi = max(lo, len(prefix)) + 2
        hi = s.get("maxItems", default_hi) if isinstance(s.get("maxItems"), int) else default_hi
        n = rng.randint(min(lo, hi), max(lo, hi)) if rng.random() < 0.9 else rng.randint(0, 4)
        if items is False:
            n = min(n, len(prefix)) if rng.random() < 0.9 else n
        out = []
        for i in range(n):
            sub = prefix[i] if i < len(prefix) else items
            if "contains" in s and rng.random() < 0.4:
                sub = s["contains"]
            out.append(self.value(sub, depth + 1))
        if s.get("uniqueItems") and rng.random() < 0.7:
            unique: list[Any] = []
            for v in out:
                if not any(_json_equal(v, u) for u in unique):
                    unique.append(v)
            out = unique
        return out

    def t_object(self, s: dict, depth: int) -> Any:
        rng = self.rng
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        required = [r for r in s.get("required", []) if isinstance(r, str)] if isinstance(s.get("required"), list) else []
        extra = s.get("additionalProperties", True)
        out: dict[str, Any] = {}
        names = list(props)
        rng.shuffle(names)
        for n in required:
            out[n] = self.value(props.get(n, extra), depth + 1)
        for n in names:
            if n not in out and rng.random() < 0.5:
                out[n] = self.value(props[n], depth + 1)
        patterns = s.get("patternProperties") if isinstance(s.get("patternProperties"), dict) else {}
        for pattern, sub in patterns.items():
            if rng.random() < 0.5:
                matching = [k for k in KEYS if _search(pattern, k)]
                if matching:
                    key = rng.choice(matching)  # (drawn before the value: the seeds' values depend on the order)
                    out[key] = self.value(sub, depth + 1)
        if extra is not False and rng.random() < 0.3:
            k = rng.choice(KEYS + ["zz", "q"])
            if k not in out:
                out[k] = self.value(extra, depth + 1)
        dependent = s.get("dependentRequired")
        if isinstance(dependent, dict):
            for k, deps in dependent.items():
                if k in out and isinstance(deps, list) and rng.random() < 0.8:
                    for dep in deps:
                        if dep not in out:
                            out[dep] = self.value(props.get(dep, extra), depth + 1)
        most = s.get("maxProperties")
        if isinstance(most, int) and len(out) > most and rng.random() < 0.7:
            for k in list(out)[most:]:
                del out[k]
        return out


def _search(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality (`uniqueItems`'): 1 == 1.0, but True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    return a == b and isinstance(a, (int, float)) == isinstance(b, (int, float))


def mutate(rng: random.Random, v: Any) -> Any:
    """A value near `v`: a member dropped, repeated or changed, a number moved, a string edited, a type swapped."""
    r = rng.random()
    if isinstance(v, dict) and v and r < 0.5:
        v = dict(v)
        k = rng.choice(list(v))
        r2 = rng.random()
        if r2 < 0.3:
            del v[k]
        elif r2 < 0.8:
            v[k] = mutate(rng, v[k])
        else:
            v[rng.choice(KEYS)] = random_value(rng)
        return v
    if isinstance(v, list) and v and r < 0.5:
        v = list(v)
        i = rng.randrange(len(v))
        r2 = rng.random()
        if r2 < 0.3:
            del v[i]
        elif r2 < 0.6:
            v.append(copy.deepcopy(v[i]))
        else:
            v[i] = mutate(rng, v[i])
        return v
    if isinstance(v, bool):
        return not v if r < 0.7 else random_value(rng)
    if isinstance(v, (int, float)) and r < 0.7:
        return v + rng.choice([1, -1, 0.5, 2, -0.5, 0.1]) if rng.random() < 0.8 else float(v)
    if isinstance(v, str) and r < 0.7:
        return rng.choice([v + "a", v[:-1], "a" + v, v + "é", v.upper(), v + "1"])
    return random_value(rng)


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STRING_CHAR = re.compile(r"[A-Za-z0-9 \u0080-\uffff]")


def text_mutants(rng: random.Random, t: str) -> list[str]:
    """Texts near the JSON text `t`: a number respelled (the same value or a nearby one: trailing zeros, exponents,
    20 more digits, signs), a character written as a `\\u` escape, and bytes dropped, inserted, replaced or moved."""
    out = []
    numbers = [m for m in _NUMBER.finditer(t) if m.start() == 0 or t[m.start() - 1] in ":[, "]
    if numbers:
        m = rng.choice(numbers)
        out += [t[:m.start()] + v + t[m.end():] for v in rng.sample(_respellings(m.group()), 5)]
    chars = [i for i, c in enumerate(t) if _STRING_CHAR.match(c)]
    if chars:
        i = rng.choice(chars)
        out.append(t[:i] + "\\u%04x" % ord(t[i]) + t[i + 1:] if ord(t[i]) < 0x10000 else t)
        out.append(t[:i] + "\\u%04X" % ord(t[i]) + t[i + 1:] if ord(t[i]) < 0x10000 else t)
        if ord(t[i]) >= 0x10000:
            hi, lo = divmod(ord(t[i]) - 0x10000, 0x400)
            out.append(t[:i] + "\\u%04x\\u%04x" % (0xD800 + hi, 0xDC00 + lo) + t[i + 1:])
    if len(t) > 1:
        i = rng.randrange(len(t))
        out.append(t[:i] + t[i + 1:])
        out.append(t[:i] + rng.choice('0123456789"\\,:{}[]aé -.eE') + t[i:])
        out.append(t[:i] + rng.choice('0123456789"aé -.eE') + t[i + 1:])
        j = rng.randrange(len(t))
        a, b = sorted((i, j))
        out.append(t[:a] + t[b:])
        out.append(t[:b] + t[a:b] + t[b:])
    return out


def _respellings(x: str) -> list[str]:
    """Numbers at and next to the number text `x`."""
    fraction = "." in x
    variants = [x + "0" if fraction else x + ".0", x + "e0", x + "E+00", "-" + x.lstrip("-"), x.lstrip("-"),
                x + "000000000000000000001" if fraction else x + ".000000000000000000001",
                x + "e-400", x + "e400", x + "e1", x + "e-1", "-0", "0.0", "-0.0", "1e-400", x + "9", x[:-1] or "0",
                x[:-1] + str((int(x[-1]) + 1) % 10) if x[-1].isdigit() else x]
    if fraction and "e" not in x.lower():
        whole, frac = x.split(".")
        variants.append(whole + "." + frac + "9999999999999999999")
        variants.append(whole + "." + frac[:-1] + ("0" if frac[-1] != "0" else "1") + "999999999999999999")
    return variants
