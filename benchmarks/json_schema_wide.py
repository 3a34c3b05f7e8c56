"""Compile plus the first mask, on schemas we do not tune on: hf_paged beside llguidance, one warm process, CPU time.

Sets (`schema_sets.py`): MaskBench (`shared/data/schemas`), JSON-Schema-Test-Suite draft 2020-12, a seeded sample
of SchemaStore's real-world schemas, generated stress schemas. The tokenizer (GPT-2), our vocabulary and trie,
the compiled kernels and llguidance's tokenizer are made once, untimed; then for every schema, each side in turn:

    ours        what `JSONSchemaLogitsProcessor` does, step by step: `load_schema` (meta-schema check),
                `schema_to_grammar` with the default `CompileBudget`, the byte automaton, the lazy token index
                with its initial mask (`index_cache._compile`); then, timed apart and not counted in the total,
                what `IndexCache` runs in its background thread once the index is published (`warm_up`: the
                warm-up masks, a grammar's root rows and per-rule facts)
    llguidance  `grammar_from_json_schema` (its defaults), `LLMatcher`, the first `fill_next_token_bitmask`

timed with `time.process_time` (CPU of the whole process: immune to other load on a shared machine, but counting
every thread). A schema a side refuses, or whose work passes our budget, is a failed compile (its time is still
reported apart: "max incl. failures"). Where a set has instances (MaskBench, the suite), each compiled schema's
instances are walked untimed through our index (written with `canonical_json`): false accepts must be 0.

Getting the sets (none is committed):

    pip download --no-binary :all: --no-deps jsonschema -d /tmp/js && tar xzf /tmp/js/jsonschema-*.tar.gz -C /tmp/js
    git clone --depth 1 https://github.com/SchemaStore/schemastore /tmp/schemastore   # or any copy of the repo
    python benchmarks/json_schema_wide.py --suite /tmp/js/jsonschema-*/json/tests/draft2020-12 \
        --schemastore /tmp/schemastore/src/schemas/json --out benchmarks/json_schema_wide_results.md

A set whose directory is not given is skipped; `--sets` picks some; `--json` keeps per-schema times, and `--merge`
reports the fastest of several runs per schema (each run its own warm process: in one process a second compile of a
schema would find its automata memoised). `--signatures OUT` times nothing: it writes each schema's outcome (a hash
of the translation's texts, the budget's counters, the first mask, the instances' walks, or the error), and
`--compare A B` lists the schemas whose outcomes differ between two such files (a change that must keep the
compiled languages: run both trees, compare; `--outcomes`: all but the texts and the text / work counters, for a
change that rewrites texts on purpose, whose languages `json_schema_languages.py` compares).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import schema_sets
from benchmarks.json_schema import DEFAULT_SHARED, machine

_WALL_GUARD_S = 60  # a safety net only: our budget counts work, so a compile should never get near it
_SLOW_MS = 300.0


@dataclass(slots=True)
class Timing:
    """One schema, one side."""

    name: str
    ok: bool
    cpu_ms: float
    status: str  # "ok" or the error class
    false_accepts: int = 0
    instances: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # ours: CPU ms per phase (`PHASES`)
    background_ms: float = 0.0  # ours: CPU ms of `warm_up` after the compile (off the caller's path, not in cpu_ms)


class _Guard(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Guard


PHASES = ("load", "translate", "rule automata", "index")  # where ours' time goes (`_ours`)
_SPENT: dict[str, float] = {}  # CPU seconds per phase of the schema being compiled


def _ours(schema, vocab, budget=None) -> object:
    from hf_paged.processors.automaton import check_automaton
    from hf_paged.processors.budget import CompileBudget
    from hf_paged.processors.index.index_cache import _compile
    from hf_paged.processors.json_schema import load_schema
    from hf_paged.processors.schema.ladder import schema_to_grammar

    _SPENT.clear()
    start = time.process_time()
    budget = budget if budget is not None else CompileBudget()
    loaded = load_schema(schema, budget)
    translated = time.process_time()
    _SPENT["load"] = translated - start
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            regex = schema_to_grammar(loaded, strict=True, budget=budget)
        check_automaton(regex, budget.for_automaton())
    finally:  # (the ladder's automata are timed by `_timed_automata`; the rest of the ladder is translation)
        _SPENT["translate"] = time.process_time() - translated - _SPENT.get("rule automata", 0.0)
    indexed = time.process_time()
    compiled = _compile(regex, vocab)  # byte automaton of a grammar's root, the first mask
    _SPENT["index"] = time.process_time() - indexed
    return compiled


def _timed_automata() -> None:
    """Time the ladder's automaton builds (`check_automaton`: a grammar's rules, a regex's DFA) apart from the
    translation (instrumentation of this benchmark only)."""
    from hf_paged.processors.schema import ladder

    build = ladder.check_automaton

    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return build(*args, **kwargs)
        finally:
            _SPENT["rule automata"] = _SPENT.get("rule automata", 0.0) + time.process_time() - start

    ladder.check_automaton = timed


def _background(compiled) -> float:
    """CPU ms of what `IndexCache` runs once the index is published (`index_cache.warm_up`), here on this thread."""
    from hf_paged.processors.index.index_cache import warm_up

    start = time.process_time()
    warm_up(compiled)
    return (time.process_time() - start) * 1e3


def _llguidance(schema, ll_tok, bitmask) -> object:
    import llguidance.numpy as llnp
    from llguidance import LLMatcher

    matcher = LLMatcher(ll_tok, LLMatcher.grammar_from_json_schema(json.dumps(schema)), log_level=0)
    if matcher.is_error():
        raise ValueError(matcher.get_error())
    llnp.fill_next_token_bitmask(matcher, bitmask, 0)
    return matcher


def _timed(fn, *args) -> tuple[object, float, str]:
    signal.alarm(_WALL_GUARD_S)
    start = time.process_time()
    try:
        out, status = fn(*args), "ok"
    except _Guard:
        out, status = None, "WallGuard"
    except RecursionError:
        out, status = None, "RecursionError"
    except Exception as exc:  # noqa: BLE001 -- recorded per schema, the run goes on
        out, status = None, type(exc).__name__
    finally:
        signal.alarm(0)
    return out, (time.process_time() - start) * 1e3, status


def _false_accepts(compiled, schema, tests, tok) -> tuple[int, int]:
    """(invalid instances our index accepts, instances checked)."""
    from benchmarks.json_schema import _texts, _walk

    wrong = checked = 0
    for valid, text in _texts(schema, tests):
        if text is None:
            continue
        checked += 1
        if not valid and _walk(compiled.index, tok.encode(text)):
            wrong += 1
    return wrong, checked


def run_set(schemas, state: dict, sides: list[str], verbose: bool) -> dict[str, list[Timing]]:
    out: dict[str, list[Timing]] = {side: [] for side in sides}
    for name, schema, tests in schemas:
        line = [name[:60]]
        for side in sides:
            if side == "ours":
                compiled, ms, status = _timed(_ours, schema, state["vocab"])
                timing = Timing(name, status == "ok", ms, status, phases={k: v * 1e3 for k, v in _SPENT.items()})
                if compiled is not None:
                    timing.background_ms = _background(compiled)
                if compiled is not None and tests:
                    timing.false_accepts, timing.instances = _false_accepts(compiled, schema, tests, state["tok"])
            else:
                _, ms, status = _timed(_llguidance, schema, state["ll_tok"], state["ll_bitmask"])
                timing = Timing(name, status == "ok", ms, status)
            out[side].append(timing)
            line.append(f"{side}={status} {ms:.0f}ms")
        if verbose:
            print("  ".join(line), flush=True)
    return out


def summarize(timings: list[Timing]) -> dict:
    ok = [t.cpu_ms for t in timings if t.ok]
    every = [t.cpu_ms for t in timings]
    pct = (lambda q: float(np.percentile(ok, q))) if ok else (lambda q: float("nan"))
    return {
        "coverage": f"{len(ok)}/{len(timings)}",
        "p50": pct(50), "p99": pct(99), "max": max(ok, default=float("nan")),
        "over": sum(ms > _SLOW_MS for ms in ok),
        "max_all": max(every, default=float("nan")),
        "over_all": sum(ms > _SLOW_MS for ms in every),
        "false_accepts": sum(t.false_accepts for t in timings),
        "instances": sum(t.instances for t in timings),
    }


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def render(header: str, command: str, results: dict[str, dict[str, list[Timing]]]) -> str:
    lines = [
        "# Compile plus the first mask, wide: hf_paged vs llguidance",
        "",
        f"Machine: {header}. Command: `{command}`.",
        ("One warm process, GPT-2 vocabulary; CPU ms per schema (`time.process_time`), compile plus the first mask "
        "(ours: `warm_up`, run after the index is published, apart). p50/p99/max over the schemas each side compiled; "
        f"\"> {_SLOW_MS:.0f}\" counts them; \"max incl. failures\" also counts the time spent on refused schemas."),
        "",
        "| set | side | coverage | p50 ms | p99 ms | max ms | > 300 ms | max incl. failures | false accepts |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for set_name, by_side in results.items():
        for side, timings in by_side.items():
            s = summarize(timings)
            fa = f"{s['false_accepts']} of {s['instances']} instances" if side == "ours" and s["instances"] else "-"
            lines.append(f"| {set_name} | {side} | {s['coverage']} | {s['p50']:.1f} | {s['p99']:.0f} | "
                         f"{s['max']:.0f} | {s['over']} | {s['max_all']:.0f} | {fa} |")
    lines += ["", ("Where ours' time goes (compiled schemas; CPU ms summed over the set, and the median schema's; "
                   "background: `warm_up` after the index is published, not in the totals above):"), "",
              "| set | " + " | ".join(PHASES) + " | background |", "|---|" + "---:|" * (len(PHASES) + 1)]
    for set_name, by_side in results.items():
        done = [t for t in by_side.get("ours", []) if t.ok]
        cells = [f"{sum(t.phases.get(p, 0.0) for t in done):.0f} ({_median([t.phases.get(p, 0.0) for t in done]):.1f})"
                 for p in PHASES]
        cells.append(f"{sum(t.background_ms for t in done):.0f} ({_median([t.background_ms for t in done]):.1f})")
        lines.append(f"| {set_name} | " + " | ".join(cells) + " |")
    lines += ["", "Slowest compiled schemas (ours), per set:", ""]
    for set_name, by_side in results.items():
        slow = sorted((t for t in by_side["ours"] if t.ok), key=lambda t: -t.cpu_ms)[:5]
        lines.append(f"- {set_name}: " + ", ".join(f"{t.name} {t.cpu_ms:.0f}" for t in slow))
    return "\n".join(lines) + "\n"


def _load_sets(args) -> dict[str, list]:
    sets: dict[str, list] = {}
    wanted = set(args.sets.split(","))
    if "maskbench" in wanted and os.path.isdir(args.maskbench):
        sets["maskbench"] = schema_sets.maskbench(args.maskbench)
    if "suite" in wanted and args.suite:
        sets["suite"] = schema_sets.suite(args.suite)
    if "schemastore" in wanted and args.schemastore:
        sets["schemastore"] = schema_sets.schemastore(args.schemastore, args.sample, args.seed)
    if "stress" in wanted:
        sets["stress"] = schema_sets.stress_schemas(args.seed)
    return sets


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `_load_sets` reads (shared with `json_schema_languages.py`)."""
    parser.add_argument("--maskbench", default=os.path.join(DEFAULT_SHARED, "schemas"))
    parser.add_argument("--suite", default=None, help="JSON-Schema-Test-Suite's tests/draft2020-12 directory")
    parser.add_argument("--schemastore", default=None, help="SchemaStore's src/schemas/json directory")
    parser.add_argument("--sample", type=int, default=300, help="schemas drawn from --schemastore")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sets", default="maskbench,suite,schemastore,stress")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_set_arguments(parser)
    parser.add_argument("--sides", default="ours,llguidance")
    parser.add_argument("--tokenizer", default=os.path.join(DEFAULT_SHARED, "tokenizers", "gpt2"))
    parser.add_argument("--out", default=None, help="write the markdown report here")
    parser.add_argument("--json", default=None, help="write per-schema timings here")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="instead: report the fastest of several runs' --json files per schema and side (a shared "
                             "machine's noise only ever adds time; each run is its own warm process)")
    parser.add_argument("--signatures", default=None, metavar="OUT", help="instead: write every schema's outcome here")
    parser.add_argument("--compare", nargs=2, default=None, metavar="SIG", help="instead: diff two --signatures files")
    parser.add_argument("--outcomes", action="store_true",
                        help="with --compare: leave out the texts and the text / work counters (a change that rewrites "
                             "texts on purpose; check the languages with json_schema_languages.py)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.compare:
        return _compare(*args.compare, outcomes=args.outcomes)
    command = "python benchmarks/json_schema_wide.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.merge:
        return _report(machine(), command, _fastest(args.merge), args)
    sys.setrecursionlimit(10_000)
    signal.signal(signal.SIGALRM, _alarm)
    _timed_automata()

    import torch
    from transformers import AutoTokenizer

    from hf_paged.processors import jit
    from hf_paged.processors.index.shared_trie import token_trie
    from hf_paged.processors.index.vocabulary import build_vocabulary

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    state = {"tok": tok, "vocab": build_vocabulary(tok)}
    token_trie(state["vocab"])
    jit.wait()
    sides = args.sides.split(",")
    if "llguidance" in sides:
        import llguidance.hf
        import llguidance.numpy as llnp

        state["ll_tok"] = llguidance.hf.from_tokenizer(tok)
        state["ll_bitmask"] = llnp.allocate_token_bitmask(1, state["ll_tok"].vocab_size)
    for side in sides:  # imports and first-call setup, untimed
        run_set([("warm", {"type": "object", "properties": {"a": {"type": "string"}}}, [])], state, [side], False)
    sets = _load_sets(args)
    if args.signatures:
        return _signatures(sets, state, args.signatures)
    gc.collect()
    gc.freeze()  # (the tokenizer, vocabulary, trie and the sets' schema documents, millions of objects, out of the
    # collector's reach: each full collection over them, ~60 ms, would land on whichever compile triggers it)
    header = machine()
    results: dict[str, dict[str, list[Timing]]] = {}
    for set_name, schemas in sets.items():
        print(f"== {set_name}: {len(schemas)} schemas", flush=True)
        results[set_name] = run_set(schemas, state, sides, args.verbose)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({k: {s: [asdict(t) for t in v] for s, v in r.items()} for k, r in results.items()}, handle)
    return _report(header, command, results, args)


def _signatures(sets: dict[str, list], state: dict, path: str) -> int:
    """Each schema's outcome, untimed: what a change that keeps the compiled languages must keep."""
    import hashlib

    from hf_paged.processors.automaton import Grammar
    from hf_paged.processors.budget import CompileBudget
    from hf_paged.processors.index.index_cache import warm_up

    out = {}
    for set_name, schemas in sets.items():
        for name, schema, tests in schemas:
            record: dict = {}
            budget = CompileBudget()
            try:
                compiled = _ours(schema, state["vocab"], budget)
                regex = compiled.regex
                texts = regex.texts if isinstance(regex, Grammar) else (regex,)
                record["texts"] = hashlib.sha1("\x00".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
                mask = compiled.mask(compiled.index.dfa.initial)
                record["mask"] = [hashlib.sha1(mask.words.tobytes()).hexdigest(), mask.num_allowed]
                warm_up(compiled)
                if tests:
                    from benchmarks.json_schema import _texts, _walk

                    record["walks"] = [bool(_walk(compiled.index, state["tok"].encode(text)))
                                       for _, text in _texts(schema, tests) if text is not None]
            except Exception as exc:  # noqa: BLE001 -- an outcome like any other
                record["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            record["budget"] = [budget.schema_objects, budget.visits, budget.checks, budget.text, budget.work]
            out[f"{set_name}/{name}"] = record
    with open(path, "w") as handle:
        json.dump(out, handle)
    print(f"{len(out)} schemas, {sum('error' in r for r in out.values())} refused: {path}")
    return 0


def _compare(first: str, second: str, outcomes: bool = False) -> int:
    with open(first) as a, open(second) as b:
        old, new = json.load(a), json.load(b)
    if outcomes:  # texts rewritten on purpose: compare the rest (`json_schema_languages.py` compares the languages)
        for records in (old, new):
            for record in records.values():
                record.pop("texts", None)
                record["budget"] = record["budget"][:3]  # (objects, visits, checks; text and work shrink with texts)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    print(f"{len(old)} / {len(new)} schemas; {len(differ)} differ" + "".join(f"\n  {k}" for k in differ[:20]))
    return 1 if differ else 0


def _report(header: str, command: str, results: dict[str, dict[str, list[Timing]]], args) -> int:
    report = render(header, command, results)
    print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)
    return 0


def _fastest(paths: list[str]) -> dict[str, dict[str, list[Timing]]]:
    """Per set, side and schema, the run with the least CPU time (outcomes are counts of work: the same in every
    run, which is checked)."""
    runs = []
    for path in paths:
        with open(path) as handle:
            runs.append({k: {s: [Timing(**t) for t in v] for s, v in r.items()} for k, r in json.load(handle).items()})
    merged = runs[0]
    for run in runs[1:]:
        for set_name, by_side in merged.items():
            for side, timings in by_side.items():
                for k, other in enumerate(run[set_name][side]):
                    mine = timings[k]
                    if (mine.name, mine.status) != (other.name, other.status):
                        raise ValueError(f"{set_name}/{side}/{mine.name}: {mine.status} in one run, {other.status} in "
                                         "another: the runs did not compile the same schemas")
                    if other.cpu_ms < mine.cpu_ms:
                        timings[k] = other
    return merged


if __name__ == "__main__":
    sys.exit(main())
