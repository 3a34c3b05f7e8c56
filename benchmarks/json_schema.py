"""JSON-schema constrained decoding benchmark: hf_paged processors vs llguidance and plain outlines-core, same
schemas, same run.

For every schema of `--schemas` (MaskBench sample, see its README), in a forked child process with a wall-clock
budget (`--timeout`, default 10 s) and a memory cap (`--memory-gb`), each side:
  1. compiles the schema for the GPT-2 vocabulary (cold: a fresh process, no cache). Ours: what
     `JSONSchemaLogitsProcessor` does, with its default `CompileBudget` (the meta-schema check, `schema_to_grammar`,
     the byte automata, the lazy token index with its initial mask and warm-up). llguidance: `LLMatcher` on
     `grammar_from_json_schema` (its default options; the `LLTokenizer` is built once before forking, like our
     vocabulary trie). outlines: `build_regex_from_schema` and the eager `Index`;
  2. feeds each test instance's tokens through the automaton (the instance is written the way our regex spells
     documents: `canonical_json`, keys in schema order, compact separators) and records accept/reject;
  3. times mask computation + application per token along the valid instances. Ours: the processors' CPU path:
     the state's mask (computed lazily on its first visit, then memoised), a copy of its words into the
     preallocated bitmask, and `apply_token_bitmask_` on a [1, 50257] fp32 logits row; the memo starts empty for
     every schema, so first visits are included (and also reported apart). llguidance: `fill_next_token_bitmask`
     and `apply_token_bitmask_inplace` on the same row. CPU times are per process (`time.process_time`: every
     thread), compile and masks alike.
Then end-to-end: a tiny random GPT-2 (n_layer=2, n_embd=64, the 50,257-token vocabulary) samples with
`JSONSchemaLogitsProcessor` in stock `model.generate` for the first `--gen-schemas` compiled schemas; every
finished output must parse with `json.loads` and validate with `jsonschema`.

Usage:
    python benchmarks/json_schema.py --limit 40 --timeout 10 --out benchmarks/json_schema_results.md
    python benchmarks/json_schema.py --sides ours,llguidance --gen-schemas 0   # llguidance: the `bench` extra
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


@dataclass(slots=True)
class SideResult:
    """One schema, one implementation."""

    status: str = "not run"  # "ok" | "timeout" | "crash" | error class name
    compile_s: float | None = None  # translation + index build, cold, wall clock
    compile_cpu_s: float | None = None  # the same, CPU time of the process (every thread; immune to other load)
    num_valid: int = 0
    num_valid_accepted: int = 0
    num_invalid: int = 0
    num_invalid_accepted: int = 0  # false accepts: must be 0 for us
    mask_us: list[float] = field(default_factory=list)  # per token, wall clock
    mask_cpu_us: list[float] = field(default_factory=list)  # per token, process CPU time
    mask_compute_cpu_us: list[float] = field(default_factory=list)  # per token, the mask alone (no copy, no apply)
    mask_first: list[bool] = field(default_factory=list)  # per token: the state's first visit (mask computed)
    grammar: bool = False  # (ours) compiled as a grammar of rules (`schema_to_grammar`), not one flat regex
    message: str = ""


# -- child-side work -------------------------------------------------------------------------------------
_STATE: dict = {}  # set in the parent before forking: tokenizer, vocabulary


def _walk(index, token_ids: list[int]) -> bool:
    state = index.get_initial_state()
    for token in token_ids:
        state = index.get_next_state(state, token)
        if state is None:
            return False
    return bool(index.is_final_state(state))


def _texts(schema, tests) -> list[tuple[bool, str | None]]:
    from hf_paged.processors.schema import canonical_json

    out = []
    for test in tests:
        try:
            text = canonical_json(schema, test["data"])
        except Exception:  # noqa: BLE001 -- a writer failure on odd data: fall back to compact JSON
            text = None
        if text is None:
            try:
                text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            except ValueError:
                text = None
        out.append((bool(test["valid"]), text))
    return out


def _run_side(side: str, schema, tests, conn) -> None:
    from outlines_core import Index

    from hf_paged.processors.index.bitmask import apply_token_bitmask_

    tok, vocab = _STATE["tokenizer"], _STATE["vocab"]
    result = SideResult()
    _warm_up(side, vocab)
    if side == "llguidance":
        _run_llguidance(schema, tests, conn, result)
        return
    try:
        start, start_cpu = time.perf_counter(), time.process_time()
        if side in ("ours", "ours-lenient"):
            from hf_paged.processors.automaton import check_automaton
            from hf_paged.processors.automaton.grammar import Grammar
            from hf_paged.processors.budget import CompileBudget
            from hf_paged.processors.index.index_cache import _compile
            from hf_paged.processors.json_schema import load_schema
            from hf_paged.processors.schema.ladder import schema_to_grammar

            budget = CompileBudget()  # (what `JSONSchemaLogitsProcessor` does, step by step)
            load_schema(schema, budget)
            with warnings.catch_warnings():  # (a regex, or a grammar of rules when the flat regex is over budget)
                warnings.simplefilter("ignore")
                regex = schema_to_grammar(schema, strict=side == "ours",
                                          undeclared_keys=_STATE.get("undeclared_keys", True), budget=budget)
            check_automaton(regex, budget.for_automaton())  # (the ladder built them: memo hits, as in the processor)
            result.grammar = isinstance(regex, Grammar)
            compiled = _compile(regex, vocab)  # byte automaton + lazy token index (trie built before forking)
            index = compiled.index
        else:
            from outlines_core.json_schema import build_regex_from_schema

            index = Index(build_regex_from_schema(json.dumps(schema)), vocab.vocabulary)
        result.compile_s = time.perf_counter() - start
        result.compile_cpu_s = time.process_time() - start_cpu
        result.status = "ok"
        conn.send({"compiled_s": result.compile_s})  # the parent stops the compile clock here
        logits = torch.zeros(1, vocab.vocab_size)
        bitmask = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
        bitmask_rows = torch.from_numpy(bitmask)  # (the processors' buffer: a tensor over the same memory)
        for valid, text in _texts(schema, tests):
            if text is None:
                continue
            ids = tok.encode(text)
            accepted = _walk(index, ids)
            if valid:
                result.num_valid += 1
                result.num_valid_accepted += accepted
            else:
                result.num_invalid += 1
                result.num_invalid_accepted += accepted
            if side != "outlines-core" and valid and accepted and len(result.mask_us) < 400:
                # the processors' CPU path (`GuidedLogitsProcessor._mask`), one row
                state = index.get_initial_state()
                for token in [*ids, None]:
                    logits.zero_()
                    first = compiled.state_mask(state) is None
                    t0, c0 = time.perf_counter(), time.process_time()
                    mask = compiled.mask(state)
                    result.mask_compute_cpu_us.append((time.process_time() - c0) * 1e6)
                    bitmask[0] = mask.words
                    apply_token_bitmask_(logits, bitmask_rows)
                    result.mask_us.append((time.perf_counter() - t0) * 1e6)
                    result.mask_cpu_us.append((time.process_time() - c0) * 1e6)
                    result.mask_first.append(first)
                    if token is not None:
                        state = index.get_next_state(state, token)
    except Exception as exc:  # noqa: BLE001 -- recorded per schema, the benchmark goes on
        result.status = type(exc).__name__
        result.message = str(exc)[:200]
    conn.send(asdict(result))
    conn.close()


def _llguidance_grammar(schema) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_json_schema(json.dumps(schema))  # (its defaults: what a user gets)


def _run_llguidance(schema, tests, conn, result: SideResult) -> None:
    """The llguidance side: compile (`LLMatcher`), instance checks, per-token mask fill + apply."""
    import llguidance.numpy as llnp
    from llguidance import LLMatcher

    ll_tok, tok, vocab = _STATE["ll_tokenizer"], _STATE["tokenizer"], _STATE["vocab"]
    try:
        start, start_cpu = time.perf_counter(), time.process_time()
        matcher = LLMatcher(ll_tok, _llguidance_grammar(schema), log_level=0)
        result.compile_s = time.perf_counter() - start
        result.compile_cpu_s = time.process_time() - start_cpu
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        result.status = "ok"
        conn.send({"compiled_s": result.compile_s})
        logits = torch.zeros(1, vocab.vocab_size)
        bitmask = llnp.allocate_token_bitmask(1, ll_tok.vocab_size)
        eos = tok.eos_token_id
        for valid, text in _texts(schema, tests):
            if text is None:
                continue
            ids = tok.encode(text)
            matcher.reset()
            accepted = matcher.try_consume_tokens(ids) == len(ids) and matcher.consume_token(eos) and \
                matcher.is_stopped()
            if valid:
                result.num_valid += 1
                result.num_valid_accepted += accepted
            else:
                result.num_invalid += 1
                result.num_invalid_accepted += accepted
            if valid and accepted and len(result.mask_us) < 400:
                matcher.reset()
                values = logits.numpy()
                for token in [*ids, None]:
                    logits.zero_()
                    t0, c0 = time.perf_counter(), time.process_time()
                    llnp.fill_next_token_bitmask(matcher, bitmask, 0)
                    result.mask_compute_cpu_us.append((time.process_time() - c0) * 1e6)
                    llnp.apply_token_bitmask_inplace(values, bitmask)
                    result.mask_us.append((time.perf_counter() - t0) * 1e6)
                    result.mask_cpu_us.append((time.process_time() - c0) * 1e6)
                    result.mask_first.append(False)  # (no memo to tell first visits apart)
                    if token is not None:
                        matcher.consume_token(token)
    except Exception as exc:  # noqa: BLE001 -- recorded per schema, the benchmark goes on
        result.status = type(exc).__name__
        result.message = str(exc)[:200]
    conn.send(asdict(result))
    conn.close()


_WARM_SCHEMA = {"type": "object", "properties": {"warm": {"type": "string"}}}


def _warm_up(side: str, vocab) -> None:
    """One untimed compile of a one-line schema, with the side's settings: the timed compile then pays for the
    schema, not for the forked process's first touches (imports, copy-on-write faults of the shared vocabulary
    and trie, a grammar automaton's first arrays when undeclared keys make the one-liner a grammar)."""
    from outlines_core import Index

    if side == "llguidance":
        from llguidance import LLMatcher

        LLMatcher(_STATE["ll_tokenizer"], _llguidance_grammar(_WARM_SCHEMA), log_level=0)
        return
    if side in ("ours", "ours-lenient"):
        import jsonschema  # noqa: F401 -- (imported on first use by the translator's value checks: ~35 ms)

        from hf_paged.processors.index.index_cache import _compile
        from hf_paged.processors.json_schema import load_schema
        from hf_paged.processors.schema import schema_to_grammar

        load_schema(_WARM_SCHEMA)  # (the meta-schema check's imports and first-call setup)
        _compile(schema_to_grammar(_WARM_SCHEMA, undeclared_keys=_STATE.get("undeclared_keys", True)), vocab)
    else:
        from outlines_core.json_schema import build_regex_from_schema

        Index(build_regex_from_schema(json.dumps(_WARM_SCHEMA)), vocab.vocabulary)


def _child(side, schema, tests, conn, memory_gb) -> None:
    limit = int(memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    torch.set_num_threads(1)
    try:
        _run_side(side, schema, tests, conn)
    except MemoryError:
        conn.send(asdict(SideResult(status="MemoryError")))


def run_side(side: str, schema, tests, timeout: float, memory_gb: float) -> SideResult:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(side, schema, tests, child, memory_gb))
    proc.start()
    child.close()
    # the compile budget covers translation + index (first message); instance walks and mask timing get 30 s more
    result = SideResult(status="no answer")
    try:
        if parent.poll(timeout + 1):
            first = parent.recv()
            if "compiled_s" not in first:  # failed before compiling: the final result came straight away
                result = SideResult(**first)
            elif parent.poll(30):
                result = SideResult(**parent.recv())
            else:
                result = SideResult(status="ok", compile_s=first["compiled_s"], message="instance checks timed out")
    except EOFError:
        result = SideResult(status="crash")
    proc.join(1)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if result.status == "ok" and result.compile_s is not None and result.compile_s > timeout:
        result.status = "timeout"
    if result.status == "no answer":
        result.status = "timeout"
    if proc.exitcode not in (0, None) and result.status == "not run":
        result.status = "crash"
    return result


# -- end-to-end generation -----------------------------------------------------------------------------
class ClosingBias:
    """Adds `bias` to the logits of `token_ids` (a plain transformers logits processor)."""

    def __init__(self, token_ids: list[int], bias: float) -> None:
        self.token_ids = torch.tensor(sorted(set(token_ids)))
        self.bias = bias

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.token_ids] += self.bias
        return scores


def generate_compliance(
    schemas: list[tuple[str, dict]], max_new_tokens: int, rows: int, args_bias: float = 0.0
) -> dict:
    import jsonschema
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_paged.processors import IndexCache, JSONSchemaLogitsProcessor

    tok = _STATE["tokenizer"]
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        vocab_size=len(tok),
        n_positions=1024,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    model = GPT2LMHeadModel(config).eval()
    cache = IndexCache(max_compile_s=60)
    stats = {"schemas": 0, "generations": 0, "finished": 0, "parsed": 0, "valid": 0, "failures": []}
    prompt = torch.tensor([[tok.eos_token_id] * 4] * rows)
    # A random model almost never closes an open string or object by chance (schemas allow extra keys and
    # unbounded strings). A fixed bonus on closing tokens ('"', '}', ']' and their combinations) and EOS makes
    # documents end within the budget; it runs before the constraint, so it never makes a refused token allowed.
    closing = [i for t, i in tok.get_vocab().items() if t and set(t) <= set('"}]')] + [tok.eos_token_id]
    bias = ClosingBias(closing, args_bias)
    for name, schema in schemas:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proc = JSONSchemaLogitsProcessor(schema, tok, index_cache=cache)
        stats["schemas"] += 1
        with torch.no_grad():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                logits_processor=[bias, proc],
                do_sample=True,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.eos_token_id,
            )
        for row in out[:, prompt.shape[1] :].tolist():
            stats["generations"] += 1
            if tok.eos_token_id not in row:
                continue
            stats["finished"] += 1
            text = tok.decode(row[: row.index(tok.eos_token_id)])
            try:
                doc = json.loads(text)
                stats["parsed"] += 1
                jsonschema.validate(doc, schema)
                stats["valid"] += 1
            except Exception as exc:  # noqa: BLE001
                stats["failures"].append(f"{name}: {type(exc).__name__}: {text[:120]!r}")
    return stats


# -- lazy index == outlines-core's eager Index ----------------------------------------------------------
def check_eager(schemas: list[tuple[str, dict]], max_eager_s: float = 5.0) -> dict:
    """Walk every state reachable in both our lazy index and outlines-core's eager `Index` (same anchored regex,
    same GPT-2 vocabulary) in lockstep: allowed tokens, finality and moves must agree everywhere."""
    from collections import deque

    from outlines_core import Index

    from hf_paged.processors.automaton import anchored
    from hf_paged.processors.index.index_cache import _compile
    from hf_paged.processors.schema import schema_to_regex

    vocab = _STATE["vocab"]
    eos = vocab.eos_token_ids[0]
    stats = {"schemas": 0, "states": 0, "mismatches": []}
    for name, schema in schemas:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            regex = schema_to_regex(schema, undeclared_keys=_STATE.get("undeclared_keys", True))
        start = time.perf_counter()
        eager = Index(anchored(regex), vocab.vocabulary)
        if time.perf_counter() - start > max_eager_s:
            continue
        lazy = _compile(regex, vocab).index
        pair = (eager.get_initial_state(), lazy.get_initial_state())
        seen, queue = {pair}, deque([pair])
        while queue:
            e_state, l_state = queue.popleft()
            expected = set(eager.get_allowed_tokens(e_state) or []) - {eos}
            if expected != set(lazy.get_allowed_tokens(l_state)) - set(vocab.eos_token_ids) or bool(
                eager.is_final_state(e_state)
            ) != lazy.is_final_state(l_state):
                stats["mismatches"].append(f"{name}: eager state {e_state}")
                break
            if not _count_matches_words(lazy.state_mask(l_state), vocab):  # the count and forced token saved
                stats["mismatches"].append(f"{name}: saved count of state {l_state}")
                break
            for token in expected:
                following = (eager.get_next_state(e_state, token), lazy.get_next_state(l_state, token))
                if following not in seen:
                    seen.add(following)
                    queue.append(following)
        stats["schemas"] += 1
        stats["states"] += len(seen)
    return stats


def _count_matches_words(mask, vocab) -> bool:
    """The count and the forced token saved with a mask agree with its words."""
    allowed = np.flatnonzero(np.unpackbits(mask.words.view(np.uint8), count=vocab.vocab_size, bitorder="little"))
    only = int(allowed[0]) if allowed.shape[0] == 1 and int(allowed[0]) not in vocab.eos_token_ids else -1
    return mask.num_allowed == allowed.shape[0] and mask.forced == only


# -- per-state mask cost of reference patterns ------------------------------------------------------------
PROBE_SCHEMAS = [  # translated by `schema_to_regex`, as the processors do
    ("string", {"type": "string"}),
    ("string, maxLength 16 (counted)", {"type": "string", "maxLength": 16}),
    ("string, maxLength 64 (counted)", {"type": "string", "maxLength": 64}),
    ("string, maxLength 256 (counted)", {"type": "string", "maxLength": 256}),
    ("number", {"type": "number"}),
    ("enum of 3 strings", {"enum": ["alpha", "beta", "gamma"]}),
    (
        "object of 3 keys (string, integer, boolean)",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "n": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["name", "n", "ok"],
        },
    ),
]


def mask_probe() -> list[dict]:
    """First-visit cost of every state of a few reference patterns (a fresh index each: nothing memoised)."""
    from hf_paged.processors.index.index_cache import _compile
    from hf_paged.processors.schema import schema_to_regex

    vocab = _STATE["vocab"]
    rows = []
    for label, schema in PROBE_SCHEMAS:  # (undeclared keys as the run says: the object's flat regex then holds
        # free values two levels deep, hundreds of states)
        index = _compile(schema_to_regex(schema, undeclared_keys=_STATE.get("undeclared_keys", True)), vocab).index
        index = type(index)(index.dfa, vocab, index.trie)  # fresh memo (the compile warmed the initial state)
        costs = []
        for state in range(index.dfa.num_states):
            start = time.thread_time()
            index.state_mask(state)
            costs.append((time.thread_time() - start) * 1e6)
        rows.append(
            {"pattern": label, "states": len(costs), "p50": _pct(costs, 50), "p90": _pct(costs, 90), "max": max(costs)}
        )
    return rows


# -- report ----------------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(side: str, results: dict[str, SideResult], timeout: float) -> dict:
    done = [r for r in results.values() if r.status == "ok"]
    times = [r.compile_s * 1e3 for r in done]
    cpu_times = [r.compile_cpu_s * 1e3 for r in done if r.compile_cpu_s is not None]
    glaive = [r.compile_s * 1e3 for n, r in results.items() if r.status == "ok" and n.startswith("Glaiveai2K")]
    masks = [m for r in done for m in r.mask_us]
    masks_cpu = [m for r in done for m in r.mask_cpu_us]
    compute_cpu = [m for r in done for m in r.mask_compute_cpu_us]
    compute_later = [m for r in done for m, f in zip(r.mask_compute_cpu_us, r.mask_first) if not f]
    first_cpu = [m for r in done for m, f in zip(r.mask_cpu_us, r.mask_first) if f]
    later_cpu = [m for r in done for m, f in zip(r.mask_cpu_us, r.mask_first) if not f]
    flat_cpu = [m for r in done if not r.grammar for m in r.mask_cpu_us]
    grammar_cpu = [m for r in done if r.grammar for m in r.mask_cpu_us]
    glaive_cpu = [
        r.compile_cpu_s * 1e3
        for n, r in results.items()
        if r.status == "ok" and n.startswith("Glaiveai2K") and r.compile_cpu_s is not None
    ]
    valid = sum(r.num_valid for r in done)
    invalid = sum(r.num_invalid for r in done)
    return {
        "side": side,
        "coverage": f"{len(done)}/{len(results)} ({100 * len(done) / max(1, len(results)):.1f}%)",
        "compile_ms_p50": _pct(times, 50),
        "compile_ms_p90": _pct(times, 90),
        "compile_ms_p99": _pct(times, 99),
        "glaive_compile_ms_p50": _pct(glaive, 50),
        "compile_cpu_ms_p50": _pct(cpu_times, 50),
        "compile_cpu_ms_p90": _pct(cpu_times, 90),
        "compile_cpu_ms_p99": _pct(cpu_times, 99),
        "glaive_compile_cpu_ms_p50": _pct(glaive_cpu, 50),
        "mask_compute_cpu_us_p50": _pct(compute_cpu, 50),
        "mask_compute_cpu_us_p99": _pct(compute_cpu, 99),
        "mask_compute_later_cpu_us_p50": _pct(compute_later, 50),
        "mask_cpu_us_p50": _pct(masks_cpu, 50),
        "mask_cpu_us_p99": _pct(masks_cpu, 99),
        "mask_first_cpu_us_p50": _pct(first_cpu, 50),
        "mask_first_cpu_us_p99": _pct(first_cpu, 99),
        "mask_first_cpu_us_max": max(first_cpu) if first_cpu else float("nan"),
        "mask_later_cpu_us_p50": _pct(later_cpu, 50),
        "mask_later_cpu_us_p99": _pct(later_cpu, 99),
        "mask_first_visits": f"{len(first_cpu)}/{len(masks_cpu)}",
        "mask_flat_cpu_us_p99": _pct(flat_cpu, 99),
        "mask_grammar_cpu_us_p99": _pct(grammar_cpu, 99),
        "grammar_schemas": f"{sum(r.grammar for r in done)} ({len(grammar_cpu)} timed tokens)",
        "mask_us_p50": _pct(masks, 50),
        "mask_us_p99": _pct(masks, 99),
        "mask_samples": len(masks),
        "accept_valid": f"{sum(r.num_valid_accepted for r in done)}/{valid}",
        "reject_invalid": f"{invalid - sum(r.num_invalid_accepted for r in done)}/{invalid}",
        "false_accepts": sum(r.num_invalid_accepted for r in done),
        "failures": {
            s: sum(r.status == s for r in results.values())
            for s in sorted({r.status for r in results.values()} - {"ok"})
        },
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = os.getloadavg()
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs (load average at start {load[0]:.1f}), Python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", default=os.path.join(DEFAULT_SHARED, "schemas"))
    parser.add_argument("--tokenizer", default=os.path.join(DEFAULT_SHARED, "tokenizers", "gpt2"))
    parser.add_argument("--limit", type=int, default=None, help="first N schemas (sorted by name)")
    parser.add_argument("--stride", type=int, default=1, help="take every k-th schema (a spread-out sample)")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile budget per schema and side, seconds")
    parser.add_argument("--repeats", type=int, default=1,
                        help="cold compiles per schema and side, each in a fresh fork; the fastest is reported (a shared "
                             "machine's noise only ever adds time). Masks are timed on the first")
    parser.add_argument("--memory-gb", type=float, default=4.0, help="address-space cap of each child")
    parser.add_argument("--gen-schemas", type=int, default=10, help="schemas used for end-to-end generation")
    parser.add_argument("--gen-rows", type=int, default=2)
    parser.add_argument("--closing-bias", type=float, default=8.0, help="logit bonus of closing tokens and EOS")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument(
        "--sides",
        default="ours,outlines-core",
        help="comma-separated: ours (strict=True), ours-lenient (strict=False), llguidance, outlines-core",
    )
    parser.add_argument("--check-eager", type=int, default=0, help="compare N compiled schemas with eager Index")
    parser.add_argument("--declared-keys-only", action="store_true",
                        help="ours: undeclared_keys=False (objects with declared properties and no "
                             "additionalProperties keyword get their declared keys only)")
    parser.add_argument("--out", default=None, help="write the markdown report here")
    parser.add_argument("--cold-start", type=int, default=0, metavar="RUNS",
                        help="instead: time the first constrained request of fresh processes, RUNS times each with "
                             "numba's cache emptied (a fresh install) and warm")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.cold_start:
        report = cold_start(args.cold_start, args.tokenizer)
        print(report)
        if args.out:
            with open(args.out, "w") as handle:
                handle.write(report)
        return 0

    from transformers import AutoTokenizer

    from hf_paged.processors.index.vocabulary import build_vocabulary

    files = sorted(glob.glob(os.path.join(args.schemas, "*.json")))[:: args.stride][: args.limit]
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    _STATE["tokenizer"] = tok
    _STATE["undeclared_keys"] = not args.declared_keys_only
    _STATE["vocab"] = build_vocabulary(tok)
    from hf_paged.processors.index.shared_trie import token_trie

    trie_start = time.thread_time()
    token_trie(_STATE["vocab"])  # once per vocabulary, before forking: every child shares it
    from hf_paged.processors import jit

    jit.wait()  # the compiled kernels, loaded (or compiled in a child process) before forking: no child pays it
    # the parent's objects out of the collector's reach: a full collection in a forked child otherwise writes to
    # every one of them and copies the parent's heap page by page (measured: a 175 ms pause on one mask)
    gc.freeze()
    _STATE["trie_cpu_s"] = time.thread_time() - trie_start
    header = machine()
    print(f"machine: {header}\nschemas: {len(files)} from {args.schemas}", flush=True)

    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = set(sides) - {"ours", "ours-lenient", "llguidance", "outlines-core"}
    if unknown or "ours" not in sides:
        parser.error("--sides must include 'ours' and only name ours, ours-lenient, llguidance, outlines-core; got "
                     f"{args.sides}")
    if "llguidance" in sides:  # (benchmark only: `pip install hf_paged[bench]`; the library never imports it)
        import llguidance.hf

        _STATE["ll_tokenizer"] = llguidance.hf.from_tokenizer(tok)
    results: dict[str, dict[str, SideResult]] = {s: {} for s in sides}
    started = time.time()
    for k, path in enumerate(files):
        name = os.path.basename(path)[: -len(".json")]
        with open(path) as handle:
            spec = json.load(handle)
        for side in sides:
            results[side][name] = run_side(side, spec["schema"], spec.get("tests", []), args.timeout, args.memory_gb)
        for _ in range(args.repeats - 1):  # more cold compiles, sides interleaved: each keeps its fastest
            for side in sides:
                best = results[side][name]
                if best.status != "ok":
                    continue
                again = run_side(side, spec["schema"], [], args.timeout, args.memory_gb)
                if again.status == "ok" and again.compile_s is not None and again.compile_cpu_s is not None:
                    best.compile_s = min(best.compile_s, again.compile_s)  # type: ignore[type-var]
                    best.compile_cpu_s = min(best.compile_cpu_s, again.compile_cpu_s)  # type: ignore[type-var]
        line = "  ".join(
            f"{s}={results[s][name].status}"
            + (f" {results[s][name].compile_s * 1e3:.0f}ms" if results[s][name].compile_s else "")
            for s in sides
        )
        print(f"[{k + 1}/{len(files)} {time.time() - started:.0f}s] {name}: {line}", flush=True)

    summaries = [summarize(s, results[s], args.timeout) for s in sides]
    ours_ok = [n for n, r in results["ours"].items() if r.status == "ok" and r.compile_s < 2.0]
    gen_names = ours_ok[: args.gen_schemas]
    schemas_by_name = {}
    for path in files:
        name = os.path.basename(path)[: -len(".json")]
        if name in gen_names or name in ours_ok[: args.check_eager]:
            with open(path) as handle:
                schemas_by_name[name] = json.load(handle)["schema"]
    gen = generate_compliance(
        [(n, schemas_by_name[n]) for n in gen_names], args.max_new_tokens, args.gen_rows, args.closing_bias
    )

    probe = mask_probe()
    checked = check_eager([(n, schemas_by_name[n]) for n in ours_ok[: args.check_eager]])
    report = render(header, args, len(files), summaries, gen, results, probe, checked)
    print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)
    return 0


# -- cold start: the first constrained request of a fresh process ----------------------------------------------
_FIRST_REQUEST = r"""
import json, sys, time
setup = time.process_time(), time.perf_counter()
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from hf_paged.processors import JSONSchemaLogitsProcessor
kind, path = sys.argv[1], sys.argv[2]
if kind == "model":  # the demo's case: the embedded model and its byte-level tokenizer, stock generate
    from hf_paged.api.models import default_model
    model, tok = default_model()
else:
    tok = AutoTokenizer.from_pretrained(path)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer",
          "minimum": 0}, "email": {"type": "string", "format": "email"}, "tags": {"type": "array", "items":
          {"type": "string"}}}, "required": ["name", "age"]}
DOC = '{"name":"Ada Lovelace","age":36,"email":"ada@example.com","tags":["math","poetry","engines"]}'
def request(schema):
    processor = JSONSchemaLogitsProcessor(schema, tok)
    if kind == "model":
        ids = tok("Name: Ada, age 36. JSON:", return_tensors="pt")
        model.generate(**ids, logits_processor=[processor], max_new_tokens=48, do_sample=False)
        return
    index = processor.compiled.index  # (GPT-2: the masks along a document, as decoding computes them)
    state = index.get_initial_state()
    for token in tok.encode(DOC):
        index.state_mask(state)
        state = index.get_next_state(state, token)
times = [(time.process_time(), time.perf_counter())]
for n in range(3):  # first request, then two more with new schemas (compiled kernels by then)
    request(dict(SCHEMA, required=["name", "age"][: 2 - n]) if n else SCHEMA)
    times.append((time.process_time(), time.perf_counter()))
print(json.dumps([[c1 - c0, w1 - w0] for (c0, w0), (c1, w1) in zip(times, times[1:])]), flush=True)
try:  # (untimed: let a compile running in the background finish writing numba's cache for the next run)
    from hf_paged.processors import jit
    jit.wait(300) if jit._thread is not None else None
except ImportError:
    pass
"""


def cold_start(runs: int, tokenizer: str) -> str:
    """Fresh processes: the first constrained request with numba's cache emptied (a fresh install) and with it
    warm (a later run), and the requests after it, CPU and wall clock. The first request builds the tokenizer's
    vocabulary trie (once per process, as a user's first request does), which is where the compiled walks used to
    be compiled or loaded."""
    import statistics
    import subprocess
    import tempfile

    rows = []
    for kind in ("model", "gpt2"):
        cache = tempfile.mkdtemp(prefix="numba-cache-")
        results: dict[str, list] = {"cold": [], "warm": []}
        for _ in range(runs):
            for label in ("cold", "warm"):
                if label == "cold":  # an empty cache directory: what a fresh install has
                    cache = tempfile.mkdtemp(prefix="numba-cache-")
                env = dict(os.environ, NUMBA_CACHE_DIR=cache)
                out = subprocess.run([sys.executable, "-c", _FIRST_REQUEST, kind, tokenizer], env=env, cwd=ROOT,
                                     capture_output=True, text=True, check=True)
                results[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for label, runs_of in results.items():
            first = [r[0] for r in runs_of]
            later = [r[2] for r in runs_of]
            rows.append(f"| {kind} | {label} | {statistics.median(c for c, _ in first) * 1e3:.0f} / "
                        f"{statistics.median(w for _, w in first) * 1e3:.0f} | "
                        f"{statistics.median(c for c, _ in later) * 1e3:.0f} / "
                        f"{statistics.median(w for _, w in later) * 1e3:.0f} |")
    return "\n".join([
        "# Cold start: the first constrained request of a fresh process",
        "",
        (f"Machine: {machine()}. Command: `python benchmarks/json_schema.py {' '.join(sys.argv[1:])}`. Medians "
         f"of {runs} runs. `model`: the embedded default model (byte-level tokenizer), a JSON-schema request through "
         "stock `generate` (48 new tokens); `gpt2`: GPT-2's tokenizer, the processor plus the masks along a "
         "document. The first request includes what a process's first request pays once (the tokenizer's "
         "vocabulary and trie). cold: numba's cache directory empty (a fresh install); warm: the same directory, "
         "after a run that filled it."),
        "",
        "| case | numba cache | first request CPU / wall ms | third request CPU / wall ms |",
        "|---|---|---|---|",
        *rows,
    ]) + "\n"


def render(header, args, num_files, summaries, gen, results, probe, checked) -> str:
    lines = [
        "# JSON-schema constrained decoding: hf_paged vs " + " and ".join(
            s["side"] for s in summaries if s["side"] not in ("ours", "ours-lenient")),
        "",
        f"Machine: {header}. Command: `python benchmarks/json_schema.py {' '.join(sys.argv[1:])}`.",
        (
            f"Schemas: {num_files} of MaskBench (`shared/data/schemas`), GPT-2 vocabulary (50,257 tokens), "
            f"compile budget {args.timeout:g} s per schema and side, cold compiles in a fresh forked process "
            "after one untimed compile of a one-line schema (imports, copy-on-write page faults) "
            f"(no cache){f', the fastest of {args.repeats} per schema and side' if args.repeats > 1 else ''}. "
            "The vocabulary trie of the lazy index is built once per vocabulary before forking "
            f"({_STATE.get('trie_cpu_s', float('nan')) * 1e3:.0f} ms CPU) and is not part of any compile time."
        ),
        "",
        "| metric | " + " | ".join(s["side"] for s in summaries) + " |",
        "|---|" + "---|" * len(summaries),
    ]
    rows = [
        ("compile coverage", "coverage", "{}"),
        ("compile ms p50", "compile_ms_p50", "{:.0f}"),
        ("compile ms p90", "compile_ms_p90", "{:.0f}"),
        ("compile ms p99", "compile_ms_p99", "{:.0f}"),
        ("compile ms p50, Glaive function-call schemas", "glaive_compile_ms_p50", "{:.0f}"),
        ("compile CPU ms p50 (process CPU time)", "compile_cpu_ms_p50", "{:.1f}"),
        ("compile CPU ms p90", "compile_cpu_ms_p90", "{:.0f}"),
        ("compile CPU ms p99", "compile_cpu_ms_p99", "{:.0f}"),
        ("compile CPU ms p50, Glaive", "glaive_compile_cpu_ms_p50", "{:.0f}"),
        ("mask alone (no apply) CPU us/token p50", "mask_compute_cpu_us_p50", "{:.1f}"),
        ("mask alone CPU us/token p99, first visits included", "mask_compute_cpu_us_p99", "{:.1f}"),
        ("mask alone CPU us/token p50, memo hits (llguidance: every token)", "mask_compute_later_cpu_us_p50",
         "{:.1f}"),
        ("mask compute+apply us/token p50", "mask_us_p50", "{:.1f}"),
        ("mask compute+apply us/token p99", "mask_us_p99", "{:.1f}"),
        ("mask compute+apply CPU us/token p50", "mask_cpu_us_p50", "{:.1f}"),
        ("mask compute+apply CPU us/token p99", "mask_cpu_us_p99", "{:.1f}"),
        ("  first visits of a state (mask computed): tokens", "mask_first_visits", "{}"),
        ("  first visits: CPU us p50", "mask_first_cpu_us_p50", "{:.1f}"),
        ("  first visits: CPU us p99", "mask_first_cpu_us_p99", "{:.1f}"),
        ("  first visits: CPU us max", "mask_first_cpu_us_max", "{:.1f}"),
        ("  memo hits (llguidance: every token) CPU us p50", "mask_later_cpu_us_p50", "{:.1f}"),
        ("  memo hits (llguidance: every token) CPU us p99", "mask_later_cpu_us_p99", "{:.1f}"),
        ("  schemas compiled flat: CPU us p99", "mask_flat_cpu_us_p99", "{:.1f}"),
        ("  schemas compiled as grammars: CPU us p99", "mask_grammar_cpu_us_p99", "{:.1f}"),
        ("  schemas compiled as grammars", "grammar_schemas", "{}"),
        ("accept valid instances (compiled schemas)", "accept_valid", "{}"),
        ("reject invalid instances (compiled schemas)", "reject_invalid", "{}"),
        ("false accepts", "false_accepts", "{}"),
        ("failures by kind", "failures", "{}"),
    ]
    for label, key, fmt in rows:
        cells = []
        for s in summaries:
            value = s[key]
            cells.append("-" if isinstance(value, float) and math.isnan(value) else fmt.format(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        (
            f"Mask timing: {summaries[0]['mask_samples']} tokens along accepted valid instances, one row, the "
            "processors' CPU path: the state's mask (lazy: computed on the state's first visit, then memoised; the "
            "memo starts empty for every schema, so first visits are included in p50/p99), a copy of its words into "
            "the bitmask, `apply_token_bitmask_` on a [1, 50257] fp32 row; llguidance: `fill_next_token_bitmask`, then "
            "`apply_token_bitmask_inplace` on the same row. \"Mask alone\" rows time the first step only. "
            "Wall-clock and process-CPU times are both shown: on a shared machine (see the load average) wall clock "
            "includes time spent waiting for a CPU."
        ),
        "",
        (
            f"End-to-end generation (ours, stock `generate`, tiny random GPT-2 n_layer=2 n_embd=64, sampling with "
            f"a +{args.closing_bias:g} logit bonus on closing tokens and EOS, "
            f"{args.gen_rows} rows x {gen['schemas']} schemas, max_new_tokens={args.max_new_tokens}): "
            f"{gen['finished']}/{gen['generations']} finished, {gen['parsed']}/{gen['finished']} parse with "
            f"json.loads, {gen['valid']}/{gen['finished']} validate with jsonschema."
        ),
    ]
    if checked["schemas"]:
        lines += [
            "",
            (
                "Lazy index vs outlines-core's eager `Index` (same anchored regex, same vocabulary; allowed tokens, "
                "finality, moves, and the saved allowed/banned id lists against the bitmask words): "
                f"{checked['schemas']} schemas, {checked['states']} reachable states compared, "
                f"{len(checked['mismatches'])} mismatches {checked['mismatches'][:5]}."
            ),
        ]
    lines += [
        "",
        "First-visit mask cost per automaton state of reference schemas (every state once, fresh memo, CPU us):",
        "",
        "| schema | states | p50 | p90 | max |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['pattern']} | {r['states']} | {r['p50']:.0f} | {r['p90']:.0f} | {r['max']:.0f} |" for r in probe]
    if gen["failures"]:
        lines += ["", "Generation failures:"] + [f"- {f}" for f in gen["failures"][:20]]
    false = [(n, r.num_invalid_accepted) for n, r in results["ours"].items() if r.num_invalid_accepted]
    if false:
        lines += ["", "Schemas with false accepts (ours): " + ", ".join(f"{n} ({c})" for n, c in false)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
