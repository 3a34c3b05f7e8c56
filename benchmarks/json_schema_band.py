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
    bounds      `--bounds`: what a sound bound on a rule's subset construction, cheap enough to let an unreached
                rule's build wait, could use, per distinct rule text (reached / not reached): NFA positions (a DFA
                has at most 2^positions states: fits `max_dfa_states` below 16 positions), whether the NFA is
                deterministic (no DFA row has a byte class whose covering spans lead to two or more states: then
                DFA states <= positions + 1), DFA states / positions and steps / positions

    python benchmarks/json_schema_band.py --schemastore /tmp/schemastore/src/schemas/json
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import os
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import json_schema_wide as wide
from benchmarks.json_schema import DEFAULT_SHARED, machine


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


def _determinism(nfa, layout) -> tuple[int, bool]:
    """(states, deterministic) of `nfa`'s subset construction, by the twin's rules (`dfa_python`: closures over
    (state, past the end) pairs, pieces of byte classes, seeds the covering spans' next states), written again to see
    each piece's seeds: deterministic when no piece has two or more. `states` must equal the kernel's count."""
    from hf_paged.processors.automaton.dfa_kernel import LOOK, MATCH, SPARSE, SPLIT

    sp_ptr, spans, eps_ptr, _ = layout
    kinds, eps, look = nfa.kinds.tolist(), nfa.eps.tolist(), nfa.look.tolist()
    spans_of = [spans[sp_ptr[q]:sp_ptr[q + 1]].tolist() for q in range(len(kinds))]
    memo: dict[int, tuple[frozenset, bool]] = {}

    def closure(seed: int, at_start: bool = False) -> tuple[frozenset, bool]:
        out, final, stack, seen = set(), False, [(seed, False)], set()
        while stack:
            state, ended = item = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            if kinds[state] == SPARSE:
                if not ended and spans_of[state]:
                    out.add(state)
            elif kinds[state] == SPLIT:
                stack.extend((t, ended) for t in eps[eps_ptr[state]:eps_ptr[state + 1]])
            elif kinds[state] == LOOK:
                if look[state][0] != 0:
                    stack.append((look[state][1], True))
                elif at_start:
                    stack.append((look[state][1], ended))
            elif kinds[state] == MATCH:
                final = True
        return frozenset(out), final

    start = closure(nfa.start, True)
    if not start[0] and not start[1]:
        return 0, True
    ids, queue, deterministic = {start: 0}, [start], True
    while queue:
        members, _ = queue.pop(0)
        items = sorted(tuple(span) for q in members for span in spans_of[q])
        points = sorted({a for a, _, _ in items} | {b + 1 for _, b, _ in items})
        for lo, end in itertools.pairwise(points):
            seeds = {nxt for a, b, nxt in items if a <= lo and end - 1 <= b}
            if not seeds:
                continue
            deterministic = deterministic and len(seeds) == 1
            union, final = set(), False
            for seed in seeds:
                if seed not in memo:
                    memo[seed] = closure(seed)
                union |= memo[seed][0]
                final = final or memo[seed][1]
            key = (frozenset(union), final)
            if key != (frozenset(), False) and key not in ids:
                ids[key] = len(ids)
                queue.append(key)
    return len(ids), deterministic


def _bounds(texts: dict[str, bool]) -> None:
    """The `--bounds` table: per distinct rule text, reached by the first mask or not (see the module docstring)."""
    from hf_paged.processors.automaton.byte_dfa import regex_nfa
    from hf_paged.processors.automaton.dfa import subsets
    from hf_paged.processors.automaton.layout_kernel import nfa_layout
    from hf_paged.processors.budget import CompileBudget

    rows: dict[bool, list[tuple[int, int, int, bool]]] = {True: [], False: []}
    for text, reached in texts.items():
        meter = CompileBudget()
        nfa = regex_nfa(text, meter)
        subsets(nfa, meter)
        states, deterministic = _determinism(nfa, nfa_layout(nfa.kinds, nfa.sparse, nfa.counts, nfa.flat, nfa.split,
                                                              nfa.eps_counts))
        assert states == meter.dfa_states, f"the check's subset construction found {states} states, the kernel's " \
                                           f"{meter.dfa_states}"
        rows[reached].append((meter.nfa_states, meter.dfa_states, meter.dfa_steps, deterministic))
    print("\n| rule texts | number | under 16 positions | fewest positions | deterministic NFA | DFA states / positions "
          "(median, max) | steps / positions (median, max) |\n|---|---:|---:|---:|---:|---|---|")
    for reached, label in ((True, "reached by the first mask"), (False, "not reached")):
        found = np.array(rows[reached], dtype=np.float64).reshape(-1, 4)
        if not found.shape[0]:
            continue
        positions = found[:, 0]
        print(f"| {label} | {found.shape[0]} | {int((positions < 16).sum())} | {int(positions.min())} | "
              f"{int(found[:, 3].sum())} | {np.median(found[:, 1] / positions):.2f}, {(found[:, 1] / positions).max():.2f} "
              f"| {np.median(found[:, 2] / positions):.1f}, {(found[:, 2] / positions).max():.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    wide.add_set_arguments(parser)
    parser.set_defaults(sets="schemastore,stress")
    parser.add_argument("--tokenizer", default=os.path.join(DEFAULT_SHARED, "tokenizers", "gpt2"))
    parser.add_argument("--lo", type=float, default=3.0, help="the band's fastest schema, CPU ms")
    parser.add_argument("--hi", type=float, default=15.0, help="the band's slowest schema, CPU ms")
    parser.add_argument("--bounds", action="store_true", help="also the table of what a bound on an unreached rule's "
                        "build could use (see the module docstring; a Python subset construction per rule text)")
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
    texts: dict[str, bool] = {}  # (`--bounds`) each rule text of the band's grammars: reached by a first mask
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
        if args.bounds and recorder.last is not None and hasattr(recorder.last, "texts"):
            for text, (reached, _) in zip(recorder.last.texts, here):
                texts[text] = texts.get(text, False) or reached
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
    if args.bounds:
        _bounds(texts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
