"""Schema -> regex coverage on MaskBench files: compile coverage, valid-instance acceptance, false accepts,
refusal tally, and the cost of the regex -> byte DFA build (no token index, no tokenizer).

Per schema file (`schema` + `tests` with `valid` flags), in a forked child with a wall-clock limit:
1. `schema_to_grammar(schema)` (strict by default), what the processors compile: a regex, or for a schema whose
   flat regex is over budget a grammar of regexes that call each other; a `SchemaError` is tallied by type and
   keyword.
2. Every test instance is written with `canonical_json` and checked with Python `re.fullmatch` (a grammar: its
   rules inlined into one regex, when that stays under 400k characters and is not recursive; else the automaton
   of step 3 decides).
   A valid instance matched counts as accepted; an invalid one matched is a false accept; an accepted text that
   `jsonschema` rejects after `json.loads` is a false accept too (the serialiser cannot hide one).
3. With `--dfa` (always, for a grammar): the byte automaton the processors use (`index_cache.build_automaton`:
   outlines-core's `Index` over 256 one-byte tokens read into a numpy table, per rule for a grammar) is built
   afresh (thread CPU time measured) and the UTF-8 bytes of every instance are walked through it; the verdict
   must equal `re`'s (disagreements are counted and listed).

    python benchmarks/schema_coverage.py --dfa --out benchmarks/schema_coverage_results.md
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import re
import select
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

_DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "schemas"


@dataclass(slots=True)
class SchemaResult:
    """What one schema file gave."""

    name: str
    status: str  # "ok", an error class name, or "timeout" / "crash"
    message: str = ""
    translate_cpu_s: float = 0.0
    regex_chars: int = 0
    regex_size: int = 0  # `estimate_regex_size` (index_cache refuses above its `max_regex_size`, 200,000)
    rules: int = 0  # grammar rules (0: one flat regex)
    valid: int = 0  # valid instances with a JSON text
    valid_accepted: int = 0
    invalid: int = 0
    false_accepts: list[str] = field(default_factory=list)
    rejected_valid: list[str] = field(default_factory=list)  # canonical texts of valid instances not accepted
    dfa_cpu_s: float | None = None
    dfa_disagree: list[str] = field(default_factory=list)


_UNDECLARED_KEYS = True  # set by main() before forking

def _keyword(message: str) -> str:
    m = re.search(r"keyword `([^`]+)`", message)
    if m:
        return m.group(1)
    m = re.search(r"^([^;(]{0,60})", message)
    return m.group(1).strip() if m else message[:60]


def _dfa_accepts(automaton, text: str) -> bool:
    return automaton.accepts(text.encode("utf-8"))


_MAX_INLINE_CHARS = 400_000


def evaluate(path: Path, *, strict: bool, dfa: bool) -> SchemaResult:
    """Translate one file's schema and check its instances (runs inside the forked child)."""
    import jsonschema

    from hf_paged.errors import SchemaError
    from hf_paged.processors.automaton.grammar import Grammar, inline_grammar
    from hf_paged.processors.automaton.regex_size import estimate_regex_size
    from hf_paged.processors.schema import canonical_json, schema_to_grammar

    doc = json.loads(path.read_text())
    schema, tests = doc["schema"], doc["tests"]
    t0 = time.thread_time()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rx_text = schema_to_grammar(schema, strict=strict, undeclared_keys=_UNDECLARED_KEYS)
    except SchemaError as exc:
        return SchemaResult(path.name, type(exc).__name__, str(exc), time.thread_time() - t0)
    rules = rx_text.texts if isinstance(rx_text, Grammar) else (rx_text,)
    res = SchemaResult(path.name, "ok", translate_cpu_s=time.thread_time() - t0, regex_chars=sum(map(len, rules)),
                       regex_size=max(map(estimate_regex_size, rules)), rules=len(rules) - 1)
    automaton = None
    if dfa or len(rules) > 1:
        from hf_paged.processors.automaton import build_automaton

        if len(rules) == 1:
            from hf_paged.processors.automaton import anchored
            from hf_paged.processors.automaton.byte_dfa import build_byte_dfa

            t0 = time.thread_time()
            automaton = build_byte_dfa(anchored(rx_text), fresh=True)  # the translation may have built it
        else:
            from hf_paged.processors.automaton import byte_dfa

            byte_dfa._MEMO.clear()  # built afresh, like the flat case (the translation may have built some rules)
            t0 = time.thread_time()
            automaton = build_automaton(rx_text)
        res.dfa_cpu_s = time.thread_time() - t0
    try:
        flat = rx_text if len(rules) == 1 else inline_grammar(rx_text)
    except ValueError:  # a recursive grammar has no flat regex: the automaton decides
        flat = None
    rx = re.compile(flat) if flat is not None and (len(flat) < _MAX_INLINE_CHARS or len(rules) == 1) else None
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    texts = [(t["valid"], canonical_json(schema, t["data"])) for t in tests]
    verdicts = []
    for valid, text in texts:
        if rx is None:
            accepted = text is not None and _dfa_accepts(automaton, text)
        else:
            accepted = text is not None and rx.fullmatch(text) is not None
        verdicts.append(accepted)
        if accepted and not validator.is_valid(json.loads(text)):
            res.false_accepts.append(f"(jsonschema rejects) {text[:200]}")
        if valid:
            res.valid += text is not None
            res.valid_accepted += accepted
            if not accepted and text is not None:
                res.rejected_valid.append(text[:300])
        else:
            res.invalid += 1
            if accepted:
                res.false_accepts.append(text[:200])
    if automaton is not None:
        for (valid, text), accepted in zip(texts, verdicts):
            if text is not None and _dfa_accepts(automaton, text) != accepted:
                res.dfa_disagree.append(text[:200])
    return res


def _warm_up() -> None:
    """Fill the parent's lazy caches once, so every forked child starts with them (not timed per schema)."""
    import jsonschema  # noqa: F401

    from hf_paged.processors.schema import pattern as schema_pattern
    from hf_paged.processors.schema import schema_to_regex

    schema_to_regex({"type": "string", "pattern": "^\\D\\W\\S$"})
    schema_pattern.parse_pattern("\\D\\W\\S", "#")


def run_forked(path: Path, *, strict: bool, dfa: bool, timeout_s: float) -> SchemaResult:
    """`evaluate` in a child process, killed after `timeout_s` (Rust builds cannot be interrupted)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            out = evaluate(path, strict=strict, dfa=dfa)
        except BaseException as exc:  # noqa: BLE001 -- report any crash to the parent
            out = SchemaResult(path.name, "crash", f"{type(exc).__name__}: {exc}")
        with os.fdopen(write_fd, "wb") as f:
            pickle.dump(out, f)
        os._exit(0)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + timeout_s
    with os.fdopen(read_fd, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return SchemaResult(path.name, "timeout", f"over {timeout_s:.0f} s")
            ready, _, _ = select.select([f], [], [], left)
            if ready:
                chunk = os.read(f.fileno(), 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    os.waitpid(pid, 0)
    try:
        return pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 -- the child died (e.g. out of memory)
        return SchemaResult(path.name, "crash", "child process died without a result")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=_DEFAULT_DIR)
    parser.add_argument("--stride", type=int, default=1, help="every n-th file (sorted by name)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per schema (translate + checks)")
    parser.add_argument("--lenient", action="store_true", help="strict=False")
    parser.add_argument("--declared-keys-only", action="store_true",
                        help="undeclared_keys=False: objects with declared properties and no additionalProperties "
                             "keyword get their declared keys only")
    parser.add_argument("--dfa", action="store_true", help="also build the byte DFA and cross-check it")
    parser.add_argument("--out", type=Path, default=None, help="write a markdown summary here")
    parser.add_argument("--show", type=int, default=0, help="print up to N rejected valid texts per schema")
    parser.add_argument("--only", default=None, help="substring filter on file names")
    parser.add_argument("--dump", type=Path, default=None, help="pickle the per-schema results here")
    args = parser.parse_args(argv)
    _warm_up()
    global _UNDECLARED_KEYS
    _UNDECLARED_KEYS = not args.declared_keys_only  # read by the forked children
    files = sorted(args.dir.glob("*.json"))[:: args.stride]
    if args.only:
        files = [f for f in files if args.only in f.name]
    start = time.perf_counter()
    results = []
    for f in files:
        r = run_forked(f, strict=not args.lenient, dfa=args.dfa, timeout_s=args.timeout)
        results.append(r)
        if args.show and (r.rejected_valid or r.false_accepts or r.dfa_disagree):
            print(f"{r.name}: {r.valid_accepted}/{r.valid} FA={len(r.false_accepts)} dfa!={len(r.dfa_disagree)}")
            for t in (r.false_accepts + r.rejected_valid)[: args.show]:
                print("   ", t[:240])
    elapsed = time.perf_counter() - start
    if args.dump:
        args.dump.write_bytes(pickle.dumps(results))
    ok = [r for r in results if r.status == "ok"]
    tally = collections.Counter(r.status for r in results if r.status != "ok")
    keywords = collections.Counter(f"{r.status}: {_keyword(r.message)}" for r in results if r.status != "ok")
    valid = sum(r.valid for r in ok)
    accepted = sum(r.valid_accepted for r in ok)
    fa = sum(len(r.false_accepts) for r in ok)
    dfa_times = [r.dfa_cpu_s * 1000 for r in ok if r.dfa_cpu_s is not None]
    tr_times = [r.translate_cpu_s * 1000 for r in ok]
    disagree = sum(len(r.dfa_disagree) for r in ok)
    load = os.getloadavg()[0]
    cmd = "python benchmarks/schema_coverage.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Schema -> regex coverage (MaskBench files, Python `re` + outlines-core byte DFA)",
        "",
        (f"Command: `{cmd}`; {len(files)} files of `{args.dir.name}/`, strict={not args.lenient}, "
        f"{args.timeout:.0f} s per schema, {elapsed:.0f} s in all, load average {load:.1f} at the end."),
        "",
        f"- compile coverage: **{len(ok)}/{len(files)}** ({100 * len(ok) / max(len(files), 1):.1f}%)",
        (f"- written as grammars (big values as called rules): {sum(r.rules > 0 for r in ok)} schemas, "
        f"{sum(r.rules for r in ok)} rules; their valid instances accepted: "
        f"{sum(r.valid_accepted for r in ok if r.rules)}/{sum(r.valid for r in ok if r.rules)}"),
        (f"- valid instances accepted (accepted schemas): **{accepted}/{valid}** "
        f"({100 * accepted / max(valid, 1):.1f}%)"),
        f"- invalid instances of accepted schemas: {sum(r.invalid for r in ok)}; false accepts: **{fa}**",
        f"- translate CPU ms p50/p99: {_pct(tr_times, 0.5):.1f} / {_pct(tr_times, 0.99):.1f}",
        (f"- regex chars p50/p99/max: {_pct([r.regex_chars for r in ok], 0.5):.0f} / "
        f"{_pct([r.regex_chars for r in ok], 0.99):.0f} / {max((r.regex_chars for r in ok), default=0)}"),
        (f"- `estimate_regex_size` max: {max((r.regex_size for r in ok), default=0):,}; over the index budget of "
        f"200,000: {sum(r.regex_size > 200_000 for r in ok)}"),
    ]
    if dfa_times:
        lines += [
            (f"- byte-DFA build (`build_automaton(rx)`, a grammar's rules' automata) CPU ms p50/p99/max: "
            f"{_pct(dfa_times, 0.5):.1f} / {_pct(dfa_times, 0.99):.1f} / {max(dfa_times):.1f}; "
            f"over 1 s: {sum(t > 1000 for t in dfa_times)}"),
            f"- byte-DFA walk vs `re.fullmatch` disagreements: **{disagree}**",
        ]
    lines += [f"- failures: {dict(tally)}", "", "| failure | files |", "|---|---:|"]
    lines += [f"| {k} | {n} |" for k, n in keywords.most_common()]
    partial = [r for r in ok if r.valid_accepted < r.valid]
    lines += ["", f"Schemas with valid instances rejected: {len(partial)}: "
              + ", ".join(f"{r.name} ({r.valid_accepted}/{r.valid})" for r in partial)]
    if fa:
        lines += ["", "## False accepts", ""] + [f"- {r.name}: {t}" for r in ok for t in r.false_accepts]
    if disagree:
        lines += ["", "## DFA disagreements", ""] + [f"- {r.name}: {t}" for r in ok for t in r.dfa_disagree]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if fa or disagree else 0


if __name__ == "__main__":
    sys.exit(main())
