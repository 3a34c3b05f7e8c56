"""Generated hostile constraints for the compile-budget tests: seeded, so every run sees the same cases.

Each generator draws sizes on both sides of the limits that matter (automaton states and steps, visits, checks,
schema objects), so a case either compiles or is refused by a budget, and some land right at the edge.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

GPT2_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "tokenizers", "gpt2")


def gpt2_or_toy() -> Any:
    """GPT-2's tokenizer (50,257 tokens) from the shared data folder when it is there, else the toy byte-level one
    (the project's tests must run without that folder)."""
    if os.path.exists(os.path.join(GPT2_DIR, "tokenizer.json")):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(GPT2_DIR)
    from tests.processors.toy_tokenizers import byte_level_tokenizer

    return byte_level_tokenizer()


def _obj(props: dict, required: bool | list = True) -> dict:
    names = list(props) if required is True else [] if required is False else required
    return {"type": "object", "properties": props, "required": names}


def _scalar(rng: random.Random) -> dict:
    return rng.choice([{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"},
                       {"type": "string", "maxLength": rng.randint(1, 64)}, {"enum": ["a", "b", "c"]}])


def _deep(rng: random.Random) -> dict:
    schema: dict = _scalar(rng)
    for _ in range(rng.randint(10, 31)):
        schema = _obj({"a": schema}) if rng.random() < 0.5 else {"type": "array", "items": schema, "maxItems": 3}
    return schema


def _wide(rng: random.Random) -> dict:
    n = rng.choice([100, 400, 900, 1500, 2500])
    props = {f"p{i}": _scalar(rng) for i in range(n)}
    return _obj(props, [k for k in props if rng.random() < 0.3])


def _wide_nested(rng: random.Random) -> dict:
    n = rng.choice([50, 150, 300])
    return _obj({f"p{i}": _obj({"a": _scalar(rng), "b": _scalar(rng)}, False) for i in range(n)}, False)


def _enum(rng: random.Random) -> dict:
    n = rng.choice([1000, 5000, 12000, 30000])
    values = [f"value-{i}" for i in range(n)] if rng.random() < 0.5 else list(range(n))
    extra = {"maxLength": 8} if rng.random() < 0.5 else {}  # (a sibling keyword: every value is checked)
    return {"enum": values, **extra}


def _any_of(rng: random.Random) -> dict:
    n = rng.choice([50, 200, 500, 800])
    width = rng.randint(1, 6)
    return {"anyOf": [_obj({f"k{j}": {"type": "string"} for j in range(i, i + width)}, False) for i in range(n)]}


def _one_of(rng: random.Random) -> dict:
    n = rng.choice([10, 60, 150, 400])
    return {"oneOf": [_obj({"kind": {"const": f"t{i}"}, "v": _scalar(rng)}) for i in range(n)]}


def _pattern(rng: random.Random) -> dict:
    k = rng.randint(6, 30)
    pattern = rng.choice([
        f"^[ab]*a[ab]{{{k}}}$", f".*a.{{{k}}}$", f"^((a+)+)+b{{{k}}}$", f"^(a|aa)*c{{1,{k}}}$",
        f"^(?:[a-z]{{{k * 50},{k * 200}}})$", f"^(?:(?:[a-z0-9]{{{k}}}-){{{k}}})$", f"(.*,){{{k // 3}}}x",
        "^(" + "|".join(f"w{i}x{i}" for i in range(k * 100)) + ")$",
    ])
    return {"type": "string", "pattern": pattern}


def _lengths(rng: random.Random) -> dict:
    low = rng.choice([0, 100, 1000, 5000, 100000])
    return {"type": "string", "minLength": low, "maxLength": low + rng.choice([10, 1000, 200000])}


def _items(rng: random.Random) -> dict:
    low = rng.choice([0, 10, 1000])
    return {"type": "array", "items": _scalar(rng), "minItems": low, "maxItems": low + rng.choice([5, 500, 5000])}


def _unique(rng: random.Random) -> dict:
    n = rng.randint(5, 40)
    return {"type": "array", "items": {"enum": list(range(n))}, "uniqueItems": True, "maxItems": n}


def _ref_chain(rng: random.Random) -> dict:
    n = rng.choice([10, 100, 600])
    defs: dict = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = _scalar(rng)
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _ref_fan(rng: random.Random) -> dict:
    n = rng.choice([8, 20, 40])
    defs: dict = {f"d{i}": _obj({"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}}, False)
                  for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _ref_mutual(rng: random.Random) -> dict:
    n = rng.choice([4, 12, 30])
    defs = {f"d{i}": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": f"#/$defs/d{(i + 1) % n}"}},
                                _obj({f"k{k}": {"$ref": f"#/$defs/d{(i + k) % n}"} for k in range(3)}, False)]}
            for i in range(n)}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


SCHEMA_KINDS: dict[str, Callable[[random.Random], Any]] = {
    "deep": _deep, "wide": _wide, "wide_nested": _wide_nested, "enum": _enum, "any_of": _any_of,
    "one_of": _one_of, "pattern": _pattern, "lengths": _lengths, "items": _items, "unique": _unique,
    "ref_chain": _ref_chain, "ref_fan": _ref_fan, "ref_mutual": _ref_mutual,
}


def hostile_schemas(seed: int, per_kind: int) -> list[tuple[str, Any]]:
    """(name, schema) pairs, `per_kind` of every kind, drawn from `seed`."""
    rng = random.Random(seed)
    return [(f"{kind}#{i}", make(rng)) for i in range(per_kind) for kind, make in SCHEMA_KINDS.items()]


def _regex_atom(rng: random.Random, depth: int) -> str:
    if depth <= 0 or rng.random() < 0.3:
        return rng.choice(["a", "b", "[ab]", ".", "[0-9]", "\\d", "\\w", "[^,]", "x"])
    inner = "".join(_regex_atom(rng, depth - 1) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.3:
        inner += "|" + _regex_atom(rng, depth - 1)
    quantifier = rng.choice(["*", "+", "?", "", f"{{{rng.randint(1, 40)}}}", f"{{{rng.randint(0, 9)},{rng.randint(10, 5000)}}}"])
    return f"(?:{inner}){quantifier}"


def hostile_regexes(seed: int, count: int) -> list[tuple[str, str]]:
    """(name, pattern) pairs: nested quantifiers, big counted repetitions, explosive look-alikes."""
    rng = random.Random(seed)
    fixed = [("explode", f"(a|b)*a(a|b){{{rng.randint(14, 24)}}}"), ("count", "a{1000,5000}"),
             ("nested_count", f"(x{{{rng.randint(50, 500)}}}){{{rng.randint(50, 500)}}}"),
             ("dot_count", f".{{{rng.randint(200, 3000)}}}"), ("words", "(\\w+\\s){2,40}")]
    return fixed + [(f"random#{i}", "".join(_regex_atom(rng, 3) for _ in range(rng.randint(1, 4))))
                    for i in range(count - len(fixed))]
