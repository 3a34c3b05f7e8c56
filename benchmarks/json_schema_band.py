"""Where the median band's compile goes: the schemas of 3-15 ms CPU that set SchemaStore's and stress's p50 (issue 36).

One warm process, set up as `json_schema_wide.py` sets it up (GPT-2 vocabulary, trie and kernels made first,
untimed). First pass: every schema of the sets compiled as that benchmark compiles it (`_ours`: load, translation,
the ladder's automata, the first mask), its CPU time; the band is the schemas of `--lo`..`--hi` ms. Second pass,
over the band only, instrumented (its totals are counts; its times carry the instrumentation's overhead):

    phases      load / translation / rule automata / index, mean CPU ms a schema (`json_schema_wide._SPENT`)
    builds      every automaton built (`byte_dfa._build`: a grammar's rules, a flat regex): its text's characters,
                NFA positions, DFA states and subset-construction steps (the budget's own counters), CPU of its NFA
                and of its subset construction (the memos emptied before each schema: each builds what a first
                compile of it builds; within it, the ladder's tries share texts as they do in a compile)
    reach       the rules the first mask reached (their tables written by the index) against the others: their
                number and their builds' CPU (a rule's automaton is built at compile for its count of work, which
                decides the schema's outcome, whether or not decoding ever reaches it)
    call sites  per rule of the chosen grammar: calls to it that the grammar's texts spell (0: never called)

    python benchmarks/json_schema_band.py --schemastore /tmp/schemastore/src/schemas/json
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import json_schema_wide as wide  # noqa: E402
from benchmarks.json_schema import DEFAULT_SHARED, machine  # noqa: E402


class _Recorder:
    """Counts and CPU of every automaton built while `on`, and the last constraint the ladder checked."""

    def __init__(self) -> None:
        from hf_paged.processors.automaton import byte_dfa
        from hf_paged.processors.schema import ladder

        self.on = False
        self.builds: list[dict] = []  # one per build: key (its text), chars, positions, states, steps, nfa_s, subsets_s
        self.last = None  # the ladder's last checked constraint (the compiled one when the compile succeeds)
        build, regex_nfa, subsets, check = byte_dfa._build, byte_dfa.regex_nfa, byte_dfa.subsets, ladder.check_automaton
        current: dict = {}

        def timed_build(anchored_regex, budget, fresh, pending):
            current.clear()
            out = build(anchored_regex, budget, fresh, pending)
            if self.on:
                self.builds.append({"key": anchored_regex, "chars": len(anchored_regex), **current})
            return out

        def timed_nfa(regex, meter):
            start = time.process_time()
            out = regex_nfa(regex, meter)
            current.update(nfa_s=time.process_time() - start, positions=meter.nfa_states)
            return out

        def timed_subsets(nfa, meter):
            start = time.process_time()
            try:
                return subsets(nfa, meter)
            finally:
                current.update(subsets_s=time.process_time() - start, states=meter.dfa_states, steps=meter.dfa_steps)

        def remembered_check(constraint, budget=None):
            self.last = constraint
            return check(constraint, budget)

        byte_dfa._build, byte_dfa.regex_nfa, byte_dfa.subsets = timed_build, timed_nfa, timed_subsets
        ladder.check_automaton = remembered_check


def _forget() -> None:
    """Empty the automata memos: the first pass compiled every schema, so the second would find the band's last
    schemas' rules memoised (`grammar_rules._TEXTS` keeps 256 texts) and build nothing for them."""
    from hf_paged.processors.automaton import byte_dfa, grammar_rules

    with grammar_rules._RULES_LOCK:
        grammar_rules._TEXTS.clear()
        grammar_rules._RULES.clear()
        grammar_rules._texts_bytes = 0
    with byte_dfa._LOCK:
        byte_dfa._MEMO.clear()
        byte_dfa._FAILED.clear()
        byte_dfa._memo_bytes = 0


def _reach_and_sites(constraint, built: dict[str, float]) -> tuple[list[tuple[bool, float]], list[int]]:
    """Per rule of a grammar: (reached by the first mask, its build's CPU s); and its number of call sites."""
    from hf_paged.processors.automaton import Grammar, anchored, call_regex
    from hf_paged.processors.automaton.grammar_rules import grammar_rules

    if not isinstance(constraint, Grammar):
        return [], []
    rules = grammar_rules(constraint)  # (memoised: the compile's own rules)
    reach = [(rule._pending is None, built.get(anchored(text), 0.0)) for text, rule in zip(constraint.texts, rules)]
    sites = [sum(t.count(call_regex(n)) for t in constraint.texts) for n in range(1, len(constraint.texts))]
    return reach, sites


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    wide.add_set_arguments(parser)
    parser.set_defaults(sets="schemastore,stress")
    parser.add_argument("--tokenizer", default=os.path.join(DEFAULT_SHARED, "tokenizers", "gpt2"))
    parser.add_argument("--lo", type=float, default=3.0, help="the band's fastest schema, CPU ms")
    parser.add_argument("--hi", type=float, default=15.0, help="the band's slowest schema, CPU ms")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(10_000)
    wide._timed_automata()
    recorder = _Recorder()

    import torch
    from transformers import AutoTokenizer

    from hf_paged.processors import jit
    from hf_paged.processors.index.shared_trie import token_trie
    from hf_paged.processors.index.vocabulary import build_vocabulary

    torch.set_num_threads(1)
    vocab = build_vocabulary(AutoTokenizer.from_pretrained(args.tokenizer))
    token_trie(vocab)
    jit.wait()
    wide._ours({"type": "object", "properties": {"a": {"type": "string"}}}, vocab)
    sets = wide._load_sets(args)
    gc.collect()
    gc.freeze()
    band = []
    for set_name, schemas in sets.items():
        for name, schema, _ in schemas:
            _, ms, status = wide._timed(wide._ours, schema, vocab)
            if status == "ok" and args.lo <= ms <= args.hi:
                band.append((set_name, name, schema))
    print(f"{machine()}\n\nBand: {len(band)} schemas of {args.lo:g}-{args.hi:g} ms ({', '.join(sets)}).\n")
    recorder.on = True
    phases: collections.Counter = collections.Counter()
    reach: list[tuple[bool, float]] = []
    sites: list[int] = []
    per_schema: list[tuple[float, float]] = []  # (reached, not reached) build CPU s
    for _, _, schema in band:
        _forget()
        recorder.last = None
        first = len(recorder.builds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wide._timed(wide._ours, schema, vocab)
        phases.update(wide._SPENT)
        built = {r["key"]: r.get("nfa_s", 0.0) + r.get("subsets_s", 0.0) for r in recorder.builds[first:]}
        here, rule_sites = _reach_and_sites(recorder.last, built)
        reach += here
        sites += rule_sites
        per_schema.append((sum(s for r, s in here if r), sum(s for r, s in here if not r)))
    n = max(len(band), 1)
    print("| phase | mean CPU ms a schema |\n|---|---:|")
    for phase in wide.PHASES:
        print(f"| {phase} | {phases[phase] * 1e3 / n:.2f} |")
    builds = [b for b in recorder.builds if "states" in b]
    total = {k: sum(b[k] for b in builds) for k in ("chars", "positions", "states", "steps", "nfa_s", "subsets_s")}
    print(f"\nBuilds: {len(builds)} ({len(builds) / n:.1f} a schema): {total['chars']:,} characters, "
          f"{total['positions']:,} NFA positions, {total['states']:,} DFA states, {total['steps']:,} steps; "
          f"NFA {total['nfa_s'] * 1e3 / n:.2f} ms and subset construction {total['subsets_s'] * 1e3 / n:.2f} ms a "
          "schema")
    hit = [s for r, s in reach if r]
    missed = [s for r, s in reach if not r]
    spent = np.array(per_schema) * 1e3 if per_schema else np.zeros((1, 2))
    print(f"\nRules reached by the first mask: {len(hit)}, their builds {sum(hit) * 1e3 / n:.2f} ms a schema (median "
          f"schema {np.median(spent[:, 0]):.2f}); not reached: {len(missed)}, {sum(missed) * 1e3 / n:.2f} ms a schema "
          f"(median schema {np.median(spent[:, 1]):.2f})")
    counts = collections.Counter(min(s, 5) for s in sites)
    print("\nCall sites per rule: " + ", ".join(f"{k}{'+' if k == 5 else ''}: {counts[k]}" for k in sorted(counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
