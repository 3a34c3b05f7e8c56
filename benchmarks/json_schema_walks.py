"""Documents drawn through the compiled token index, validated with jsonschema: a soundness check on schemas with no
test instances of their own (SchemaStore's, the generated stress set).

For every schema of a set that `JSONSchemaLogitsProcessor` compiles (default options), `--walks` random walks from
the index's initial state: each step picks a uniformly random allowed token (EOS only once the state is final, then
with probability 0.3), up to `--steps` tokens. A walk that ends in a final state is decoded, parsed and validated
with jsonschema (draft 2020-12 unless the schema says otherwise); one that runs out of steps is counted, not checked.
Not a timing: CPU time is not measured.

    python benchmarks/json_schema_walks.py --schemastore SCHEMASTORE/src/schemas/json --sets schemastore,stress
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.json_schema import DEFAULT_SHARED  # noqa: E402
from benchmarks.json_schema_wide import _load_sets, add_set_arguments  # noqa: E402


def walk(index, eos: int, rng: random.Random, steps: int) -> list[int] | None:
    """One random walk's token ids, or None when it ran out of steps before a final state ended it."""
    state, ids = index.get_initial_state(), []
    for _ in range(steps):
        final = index.is_final_state(state)
        allowed = [t for t in index.get_allowed_tokens(state) if t != eos]
        if final and (not allowed or rng.random() < 0.3):
            return ids
        if not allowed:
            return None
        token = rng.choice(allowed)
        ids.append(token)
        state = index.get_next_state(state, token)
    return None


def run_set(schemas, tokenizer, walks: int, steps: int, seed: int) -> dict:
    import jsonschema

    from hf_paged.processors import JSONSchemaLogitsProcessor
    from hf_paged.processors.index import IndexCache

    cache = IndexCache()
    out = {"schemas": 0, "refused": 0, "documents": 0, "invalid": 0, "unfinished": 0, "examples": []}
    for name, schema, _ in schemas:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                index = JSONSchemaLogitsProcessor(schema, tokenizer, index_cache=cache).compiled.index
        except Exception:  # noqa: BLE001 -- a refused schema is counted, the run goes on
            out["refused"] += 1
            continue
        out["schemas"] += 1
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
        rng = random.Random(seed)
        for _ in range(walks):
            ids = walk(index, tokenizer.eos_token_id, rng, steps)
            if ids is None:
                out["unfinished"] += 1
                continue
            out["documents"] += 1
            text = tokenizer.decode(ids)
            try:
                valid = validator.is_valid(json.loads(text))
            except ValueError:
                valid = False
            if not valid:
                out["invalid"] += 1
                out["examples"].append(f"{name}: {text[:200]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_set_arguments(parser)
    parser.add_argument("--tokenizer", default=os.path.join(DEFAULT_SHARED, "tokenizers", "gpt2"))
    parser.add_argument("--walks", type=int, default=20, help="walks per schema")
    parser.add_argument("--steps", type=int, default=300, help="most tokens a walk takes")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(10_000)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    print("| set | schemas compiled | refused | documents drawn | invalid per jsonschema | walks unfinished |")
    print("|---|---:|---:|---:|---:|---:|")
    bad = 0
    for set_name, schemas in _load_sets(args).items():
        result = run_set(schemas, tokenizer, args.walks, args.steps, args.seed)
        bad += result["invalid"]
        print(f"| {set_name} | {result['schemas']} | {result['refused']} | {result['documents']} | "
              f"{result['invalid']} | {result['unfinished']} |", flush=True)
        for line in result["examples"][:5]:
            print(f"  invalid: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
