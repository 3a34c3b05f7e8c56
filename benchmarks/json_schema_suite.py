"""JSON-Schema-Test-Suite (draft 2020-12) acceptance run of `schema_to_grammar` (what the processors compile).

For every test case: translate its schema (strict), write the instance the way our regexes spell JSON
(`canonical_json`), and check it with `re.fullmatch` (a grammar: its lazily built byte automaton, which the
property tests hold equal to the inlined regex). A case passes when the verdict equals the suite's `valid`.
A refused schema (UnsupportedSchemaError, ...) fails its cases but is never a false accept. Every accepted
text is also parsed back and validated with `jsonschema`, so a false accept cannot hide behind the
serialiser.

The suite ships in the `jsonschema` source distribution (do not commit it):

    pip download --no-binary :all: --no-deps jsonschema -d /tmp/js && tar xzf /tmp/js/jsonschema-*.tar.gz -C /tmp/js
    python benchmarks/json_schema_suite.py /tmp/js/jsonschema-*/json/tests/draft2020-12

Writes its summary to benchmarks/json_schema_suite_results.md (or --out).
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import re
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema

from hf_paged.errors import SchemaError
from hf_paged.processors.automaton.grammar import Grammar
from hf_paged.processors.automaton.grammar_dfa import GrammarDFA
from hf_paged.processors.schema import canonical_json, schema_to_grammar

_TIMEOUT_S = 20  # per schema: translation plus matching


@dataclass(slots=True)
class FileResult:
    """Counts for one suite file."""

    cases: int = 0
    passed: int = 0
    false_accepts: int = 0  # invalid instance accepted: must stay 0
    false_rejects: int = 0  # valid instance our regex does not produce
    refused: int = 0  # cases of schemas we refuse to translate
    refusals: collections.Counter = field(default_factory=collections.Counter)


class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout


def run_file(path: Path, failures: list[str]) -> FileResult:
    """Run every group of one suite file."""
    result = FileResult()
    for group in json.loads(path.read_text()):
        schema, tests = group["schema"], group["tests"]
        signal.alarm(_TIMEOUT_S)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                text = schema_to_grammar(schema)
                if not isinstance(text, Grammar):
                    match = re.compile(text).fullmatch
                else:
                    automaton = GrammarDFA(text)

                    def match(doc: str, automaton: GrammarDFA = automaton) -> bool:
                        return automaton.accepts(doc.encode("utf-8"))
            signal.alarm(0)
        except (SchemaError, _Timeout, ValueError) as exc:  # (ValueError: a rule outlines-core refuses)
            signal.alarm(0)
            result.cases += len(tests)
            result.refused += len(tests)
            result.refusals[type(exc).__name__] += len(tests)
            continue
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
        for test in tests:
            result.cases += 1
            text = canonical_json(schema, test["data"])
            accepted = text is not None and bool(match(text))
            if accepted and not validator.is_valid(json.loads(text)):
                accepted_invalid_text = True
            else:
                accepted_invalid_text = False
            if accepted and (not test["valid"] or accepted_invalid_text):
                result.false_accepts += 1
                failures.append(f"{path.name}: {group['description']} / {test['description']}: {text}")
            elif accepted == test["valid"]:
                result.passed += 1
            else:
                result.false_rejects += 1
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite_dir", type=Path, help="path to json/tests/draft2020-12")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("json_schema_suite_results.md"))
    parser.add_argument("--required-only", action="store_true", help="skip optional/ (formats, bignum, ...)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)
    files = sorted(args.suite_dir.glob("*.json") if args.required_only else args.suite_dir.rglob("*.json"))
    if not files:
        parser.error(f"no *.json files in {args.suite_dir}")
    start = time.perf_counter()
    failures: list[str] = []
    rows = {str(f.relative_to(args.suite_dir)): run_file(f, failures) for f in files}
    elapsed = time.perf_counter() - start
    total = FileResult()
    for r in rows.values():
        total.cases += r.cases
        total.passed += r.passed
        total.false_accepts += r.false_accepts
        total.false_rejects += r.false_rejects
        total.refused += r.refused
        total.refusals.update(r.refusals)
    lines = [
        "# JSON-Schema-Test-Suite draft 2020-12: `schema_to_grammar` acceptance run",
        "",
        f"Command: `python benchmarks/json_schema_suite.py {args.suite_dir}"
        f"{' --required-only' if args.required_only else ''}` ({elapsed:.0f} s, jsonschema "
        f"{importlib.metadata.version('jsonschema')}).",
        "",
        f"- passed: **{total.passed}/{total.cases}** ({100 * total.passed / total.cases:.1f}%); "
        "plain outlines-core 0.2.14: 302/2063",
        f"- false accepts (invalid instance, or an accepted text jsonschema rejects): **{total.false_accepts}**",
        f"- valid instances not produced: {total.false_rejects}",
        f"- cases of refused schemas: {total.refused} ({dict(total.refusals)})",
        "",
        f"- required part only (top-level files): {sum(r.passed for n, r in rows.items() if '/' not in n)}/"
        f"{sum(r.cases for n, r in rows.items() if '/' not in n)} passed",
        "",
        "| file | cases | passed | false accepts | valid not produced | refused |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {r.cases} | {r.passed} | {r.false_accepts} | {r.false_rejects} | {r.refused} |")
    if failures:
        lines += ["", "## False accepts", ""] + [f"- {f}" for f in failures]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:9]))
    return 1 if total.false_accepts else 0


if __name__ == "__main__":
    sys.exit(main())
