"""Object keywords that relate property names to each other: `not` of `required` lists, and the dependency
keywords (`dependencies`, `dependentRequired`, `dependentSchemas`), expanded into present/absent variants.
"""

from __future__ import annotations

from typing import Any

from hf_paged.processors.schema.context import ANNOTATION_KEYWORDS, Context
from hf_paged.processors.schema.fragments import Rx, alt

__all__ = ["dependencies_of", "forbidden_names", "negated_required", "with_dependencies"]

_MAX_DEPENDENCY_VARIANTS = 4  # optional dependency triggers expanded as present/absent (2^n variants)


def negated_required(neg: Any) -> list[list[str]] | None:
    """The name lists of `not: {required: [...]}` or `not: {anyOf: [{required: [...]}, ...]}` (how `allOf` merges
    several `not`s), or None when `neg` is anything else."""
    clauses = neg.get("anyOf") if isinstance(neg, dict) and set(neg) == {"anyOf"} else [neg]
    if not isinstance(clauses, list) or not clauses:
        return None
    out = []
    for c in clauses:
        if not (isinstance(c, dict) and set(c) == {"required"} and isinstance(c["required"], list) and c["required"]
                and all(isinstance(n, str) for n in c["required"])):
            return None
        out.append(c["required"])
    return out


def forbidden_names(schema: dict, required: list[str], ctx: Context, pointer: str) -> set[str]:
    """`not` of `required` lists: keep one name of each list absent (a sound subset of 'not all present'),
    reusing names already kept out so that as few as possible go."""
    neg = schema.get("not")
    if neg is None or isinstance(neg, dict) and set(neg) - ANNOTATION_KEYWORDS == {"type"}:
        return set()  # (`not` of types other than object: `translate._allowed_types` applied it)
    clauses = negated_required(neg)
    if clauses is None:
        ctx.unsupported("not", pointer, "only `not: {required: [...]}` is supported on objects; remove `not`")
        return set()
    forbidden: set[str] = set()
    for names in clauses:
        if forbidden & set(names):
            continue
        free = [n for n in names if n not in required]
        forbidden.add(free[0] if free else names[0])  # all of them required: nothing satisfies the schema
    return forbidden


def dependencies_of(schema: dict) -> dict[str, Any]:
    deps: dict[str, Any] = {}
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        value = schema.get(key)
        if isinstance(value, dict):
            for trigger, dep in value.items():  # (a trigger under two keywords must meet both)
                deps[trigger] = {"allOf": [_as_schema(deps[trigger]), _as_schema(dep)]} if trigger in deps else dep
    return deps


def _as_schema(dep: Any) -> Any:
    return {"required": list(dep)} if isinstance(dep, list) else dep


def with_dependencies(schema: dict, deps: dict[str, Any], ctx: Context, pointer: str) -> Rx | None:
    """Expand each dependency trigger into 'present (with its dependents)' and 'absent' variants."""
    base = {k: v for k, v in schema.items() if k not in ("dependencies", "dependentRequired", "dependentSchemas")}
    required = list(base.get("required", []))
    optional = [t for t in deps if t not in required]
    if len(optional) > _MAX_DEPENDENCY_VARIANTS:
        ctx.unsupported("dependencies", pointer, f"{len(optional)} optional triggers would need "
                        f"2^{len(optional)} variants; make some of them required")
    variants: list[dict] = [base]
    for trigger, dep in deps.items():
        present: list[dict] = []
        for v in variants:
            with_t = dict(v, required=list(dict.fromkeys(list(v.get("required", [])) + [trigger])))
            if isinstance(dep, list):
                with_t["required"] = list(dict.fromkeys(with_t["required"] + list(dep)))
                present.append(with_t)
            else:
                present.append({"allOf": [with_t, dep]} if dep is not True else with_t)
            if trigger not in v.get("required", []) and trigger in optional:
                absent = dict(v, properties={**v.get("properties", {}), trigger: False})
                present.append(absent)
        variants = present[: 2 ** _MAX_DEPENDENCY_VARIANTS]
    return alt(ctx.sub(v, pointer) for v in variants)
