"""Do two trees' translations accept the same documents? A check for changes that rewrite grammar texts.

`json_schema_wide.py --compare` checks that every schema's outcome is unchanged, texts included; a change that
rewrites the texts on purpose (a value written once as a shared rule and called, instead of in place) needs the
languages compared instead. Run `--dump` in each tree (the same sets as `json_schema_wide.py`, the same
`schema_to_grammar` call with the default budget: each schema's root and rule texts, or its error), then
`--check OLD NEW` in either tree: for every schema whose texts differ, both automata (built from the texts, by the
tree running the check) walk

    instances   MaskBench's and the suite's, valid and invalid, as `canonical_json` writes them: both sides must
                accept or reject each the same way
    samples     `--samples` documents drawn from each side by a random walk of its automaton (each step picks one of
                the distinct next states uniformly, then a byte that leads there; at a final state it stops with
                probability 1/4): the other side must accept every one

and every schema refused on one side must be refused on the other with the same error class.

    python benchmarks/json_schema_languages.py --suite ... --schemastore ... --dump /tmp/texts_before.json  # old tree
    python benchmarks/json_schema_languages.py --suite ... --schemastore ... --dump /tmp/texts_after.json   # new tree
    python benchmarks/json_schema_languages.py --suite ... --schemastore ... --check /tmp/texts_before.json \\
        /tmp/texts_after.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.json_schema import _texts
from benchmarks.json_schema_wide import _load_sets, add_set_arguments  # the same sets, read the same way

_MAX_BYTES = 4_000  # a sample walk that has not stopped by then is dropped (counted)
_STOP = 0.25  # chance of stopping at a final state


def dump(sets: dict[str, list], path: str) -> int:
    from hf_paged.processors.automaton import Grammar
    from hf_paged.processors.budget import CompileBudget
    from hf_paged.processors.json_schema import load_schema
    from hf_paged.processors.schema.ladder import schema_to_grammar

    out = {}
    for set_name, schemas in sets.items():
        for name, schema, _ in schemas:
            budget = CompileBudget()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    regex = schema_to_grammar(load_schema(schema, budget), strict=True, budget=budget)
                out[f"{set_name}/{name}"] = {"texts": list(regex.texts) if isinstance(regex, Grammar) else regex}
            except Exception as exc:  # noqa: BLE001 -- an outcome like any other
                out[f"{set_name}/{name}"] = {"error": type(exc).__name__}
    with open(path, "w") as handle:
        json.dump(out, handle)
    print(f"{len(out)} schemas, {sum('error' in r for r in out.values())} refused: {path}")
    return 0


def _automaton(record: dict):
    from hf_paged.processors.automaton import Grammar, build_automaton

    texts = record["texts"]
    return build_automaton(texts if isinstance(texts, str) else Grammar(texts[0], tuple(texts[1:])))


def sample(dfa, rng: np.random.Generator) -> bytes | None:
    """One document of `dfa`'s language by a random walk (None: it ran past `_MAX_BYTES` or into a dead end)."""
    state, out = dfa.initial, bytearray()
    while len(out) < _MAX_BYTES:
        dfa.ensure_one(state)
        if dfa.finals[state] and rng.random() < _STOP:
            return bytes(out)
        row = np.asarray(dfa.transitions[state])
        targets = np.unique(row[row != dfa.dead])
        if not targets.shape[0]:
            return bytes(out) if dfa.finals[state] else None
        target = int(rng.choice(targets))
        out.append(int(rng.choice(np.flatnonzero(row == target))))
        state = target
    return None


def check(sets: dict[str, list], old_path: str, new_path: str, num_samples: int, seed: int) -> int:
    with open(old_path) as a, open(new_path) as b:
        old, new = json.load(a), json.load(b)
    tests = {f"{s}/{name}": t for s, schemas in sets.items() for name, schema, t in schemas}
    schemas = {f"{s}/{name}": schema for s, items in sets.items() for name, schema, _ in items}
    rng = np.random.default_rng(seed)
    changed = outcome_differs = instances = samples = dropped = 0
    disagree: list[str] = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if a is None or b is None or ("error" in a) != ("error" in b) or a.get("error") != b.get("error"):
            outcome_differs += 1
            disagree.append(f"{key}: outcome {a and a.get('error', 'ok')} -> {b and b.get('error', 'ok')}")
            continue
        changed += 1
        sides = (_automaton(a), _automaton(b))
        for valid, text in _texts(schemas[key], tests.get(key) or []):
            if text is None:
                continue
            instances += 1
            data = text.encode("utf-8", "surrogatepass")
            verdicts = [side.accepts(data) for side in sides]
            if verdicts[0] != verdicts[1]:
                disagree.append(f"{key}: instance {text[:80]!r} (valid={valid}) old={verdicts[0]} new={verdicts[1]}")
        for k, (mine, other) in enumerate((sides, sides[::-1])):
            for _ in range(num_samples):
                doc = sample(mine, rng)
                if doc is None:
                    dropped += 1
                    continue
                samples += 1
                if not other.accepts(doc):
                    disagree.append(f"{key}: a sample of the {('old', 'new')[k]} side {doc[:80]!r} refused by the "
                                    "other")
    print(f"{len(old)} / {len(new)} schemas; {changed} with other texts, {outcome_differs} with another outcome; "
          f"{instances} instance walks, {samples} samples ({dropped} walks dropped); {len(disagree)} disagreements"
          + "".join(f"\n  {d}" for d in disagree[:20]))
    return 1 if disagree else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_set_arguments(parser)
    parser.add_argument("--samples", type=int, default=40, help="documents drawn from each side of a changed schema")
    parser.add_argument("--dump", default=None, metavar="OUT", help="write every schema's translation texts here")
    parser.add_argument("--check", nargs=2, default=None, metavar="TEXTS", help="compare two --dump files' languages")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(10_000)
    sets = _load_sets(args)
    if args.dump:
        return dump(sets, args.dump)
    if args.check:
        return check(sets, *args.check, args.samples, args.seed)
    parser.error("pass --dump OUT or --check OLD NEW")
    return 2


if __name__ == "__main__":
    sys.exit(main())
