"""Differential fuzz of the JSON-schema compiler against `jsonschema` (Draft 2020-12), bounded and seeded.

Generated schemas (`schema_fuzz_schemas.py`) are compiled to the character-level automaton the processors build
their token masks from, then compared with jsonschema (`schema_fuzz_check.py`): the compile raises nothing but our
typed errors; every document the automaton accepts (drawn from it, edited near those, or written from drawn
values) is valid; a schema refused as unsatisfiable has no valid value among those drawn; and a valid value is
accepted wherever the compiler promises it (`schema_fuzz_exactness.py`). Number schemas get texts near their
bounds in many spellings (`schema_fuzz_numbers.py`). Last session's version of this fuzz found ten bugs in ~4,900
schemas; the seeds of the schemas that exposed bugs run here beside a fixed range. The work is counted (walks,
values, texts per schema; states a walk may search), never timed: the default run takes ~8 s of CPU beside pytest's
start (~5 s) on 2 cores, and `-m slow` runs 1,750 more schemas and 92 more with shared definitions (~60 s).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from hf_paged.errors import HfPagedError
from hf_paged.processors.automaton import build_automaton
from hf_paged.processors.schema import load_schema, schema_to_grammar
from tests.processors.schema_fuzz_check import Finding, Tally, Validator, fuzz_schema
from tests.processors.schema_fuzz_numbers import number_schema, number_texts
from tests.processors.schema_fuzz_schemas import ref_schema_for, schema_for

SEEDS = range(250)
# Schemas that exposed a bug (fixed since): false accepts (1213, 12453), a format beside an enum (2021), unsatisfiable
# yet valid (1169, 10272, 10741, 12317, 12819, 12821, 12981, 12987; 11384: escaped names under propertyNames), a
# float minimum refusing its own text (730, 828, 1679, 1870, 1957); and schemas whose automata write duplicate keys
# (32, 1002, 1037, 1072, 1151, 1210, 1264: either reading of such a text must be valid)
FOUND_SEEDS = [32, 730, 828, 1002, 1037, 1072, 1151, 1169, 1210, 1213, 1264, 1679, 1870, 1957, 2021, 10272, 10741,
               11384, 12317, 12453, 12819, 12821, 12981, 12987]
REF_SEEDS = range(50000, 50008)  # shared `$defs`
# number schemas (the last five let a fraction past a bound beyond 2**53 through, last session)
NUMBER_SEEDS = list(range(150)) + [464, 1097, 1325, 1343, 1368]
SLOW_SEEDS = range(250, 2000)
SLOW_REF_SEEDS = range(50008, 50100)


def _fuzz(seeds: Iterable[int], schema_of: Callable[[int], Any]) -> Tally:
    tally = Tally()
    for seed in seeds:
        tally.add(fuzz_schema(seed, schema_of(seed)))
    return tally


def _report(findings: list[Finding]) -> str:
    return f"{len(findings)} findings; the first:\n" + "\n".join(str(f) for f in findings[:5])


def test_generated_schemas_agree_with_jsonschema():
    tally = _fuzz(SEEDS, schema_for)
    assert not tally.findings, _report(tally.findings)
    # (a run that checks little passes too: the counts say this one did not; ~85% of today's)
    assert tally.schemas >= 240 and tally.compiled >= 150
    assert tally.documents >= 6_000 and tally.instances >= 9_400 and tally.mutants_accepted >= 25_000
    assert tally.refusals_checked >= 2_850


def test_the_schemas_that_exposed_bugs():
    tally = _fuzz(FOUND_SEEDS, schema_for)
    assert not tally.findings, _report(tally.findings)
    assert tally.compiled + tally.refused == len(FOUND_SEEDS)


def test_schemas_with_shared_definitions():
    tally = _fuzz(REF_SEEDS, ref_schema_for)
    assert not tally.findings, _report(tally.findings)
    assert tally.compiled >= 4 and tally.documents >= 150


def _number_findings(seed: int) -> tuple[list[str], int]:
    """The texts near the bounds that the automaton accepts and jsonschema rejects, and how many it accepts."""
    schema = number_schema(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dfa = build_automaton(schema_to_grammar(load_schema(schema), strict=True))
    except HfPagedError:
        return [], 0
    validator = Validator(schema)
    accepted = [t for t in number_texts(schema) if dfa.accepts(t.encode())]
    return [f"seed {seed}: {json.dumps(schema)} accepts {t}" for t in accepted
            if not validator.is_valid(json.loads(t))], len(accepted)


def test_number_texts_near_bounds_agree_with_jsonschema():
    found, num_accepted = [], 0
    for seed in NUMBER_SEEDS:
        wrong, n = _number_findings(seed)
        found += wrong
        num_accepted += n
    assert not found, "\n".join(found[:10])
    assert num_accepted >= 1_100


@pytest.mark.slow
def test_many_more_generated_schemas():
    tally = _fuzz(SLOW_SEEDS, schema_for)
    tally.add(_fuzz(SLOW_REF_SEEDS, ref_schema_for))
    assert not tally.findings, _report(tally.findings)
    assert tally.compiled >= 1_000
