"""Soak: thousands of `generate` calls in one process, each with its own constraint / settings; does memory stay flat?

A server or an evaluation job calls hf_paged for hours; anything keyed by request content and never evicted grows
without bound. Each scenario runs in a fresh child process (so one scenario's caches do not hide another's), over a
tiny random Llama with the embedded tiny-lm byte-level tokenizer (259 ids), and measures every `--every` calls:
- RSS (psutil), and its slope per 1,000 calls after the warm-up (least squares over the checkpoints past it);
- with `--tracemalloc`: the Python allocations' total and the top growing source lines between the first checkpoint
  past the warm-up and the last one;
- the sizes of the structures the inventory names (`cache_sizes`): module-level memos and engine maps.

Scenarios:
  schemas    distinct JSON schemas (a fresh `JSONSchemaLogitsProcessor` per call)
  regexes    distinct regexes (`RegexLogitsProcessor`) and distinct stop strings, alternating
  sampling   distinct seeds and sampling settings (`generate_batch` with `SamplingParams`)
  configs    alternating PagedConfig values (block size, KV dtype): unwrap / wrap the same model each call
  tokenizers a new tokenizer object each call (same vocabulary), with a fixed schema
  serve      `hf-paged serve`'s app in process (starlette's TestClient), distinct `response_format` schemas and `user`

    OMP_NUM_THREADS=1 python benchmarks/soak_memory.py --calls 5000 --every 500 [--scenario schemas ...] \
        [--tracemalloc] [--out benchmarks/soak_memory_results.md --label after]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SCENARIOS = ("schemas", "regexes", "sampling", "configs", "tokenizers", "serve")
TINY_LM = os.path.join(ROOT, "hf_paged", "assets", "tiny-lm")


# -- the structures the inventory names -------------------------------------------------------------------------
def cache_sizes(engine=None, constraints=None) -> dict[str, int]:
    """Entries of each module-level memo (and of the engine's maps, and of a server's `ConstraintCache`, when
    given): what should stay under its cap. The two compiled-index caches also give their bytes (KiB), bounded by
    `max_bytes` (`IndexCache`: 512 MiB, `HF_PAGED_INDEX_CACHE_MB`; the server's cache: the same budget)."""
    from hf_paged.processors.automaton import byte_dfa, call_graph, grammar_rules, productive, syntax
    from hf_paged.processors.index import index_cache, shared_trie, vocabulary
    from hf_paged.programs import healing

    sizes = {
        "vocab_by_fingerprint": len(vocabulary._BY_FINGERPRINT),
        "vocab_by_tokenizer": len(vocabulary._BY_TOKENIZER),
        "trie_by_fingerprint": len(shared_trie._BY_FINGERPRINT),
        "index_cache": len(index_cache.default_index_cache()),
        "index_cache_kib": index_cache.default_index_cache().num_bytes // 1024,
        "byte_dfa_memo": len(byte_dfa._MEMO),
        "byte_dfa_failed": len(byte_dfa._FAILED),
        "grammar_rule_texts": len(grammar_rules._TEXTS),
        "grammar_rules": len(grammar_rules._RULES),
        "call_graphs": len(call_graph._GRAPHS),
        "call_numbers": len(call_graph._NUMBERS),
        "syntax_chars": len(syntax._CHARS),
        "formulas": len(productive._FORMULAS),
        "healing_texts": len(healing._TEXTS),
    }
    if engine is not None:
        sizes.update({
            "engine_requests": len(engine.scheduler.requests),
            "engine_ended": len(engine.lifecycle.ended),
            "engine_sinks": len(engine.loop._sinks) if engine._loop is not None else 0,
            "draft_models": len(engine.speculator.draft_models),
            "prefix_nodes": len(engine.kv.prefix_cache._node_of_block) if engine.kv.prefix_cache is not None else 0,
            "kv_seqs": len(engine.kv.seqs),
        })
    if constraints is not None:
        sizes.update({"constraint_cache": len(constraints), "constraint_cache_kib": constraints.num_bytes // 1024})
    return sizes


def rss_bytes() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:  # (statm: pages)
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- one scenario, in this process --------------------------------------------------------------------------------
def _model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=256, eos_token_id=257, pad_token_id=258)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = 257
    model.generation_config.pad_token_id = 258
    return model


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_LM)


def _schema(i: int) -> dict:
    """A schema of its own per call: key names, bounds and enum values carry `i`."""
    kinds = [
        {"type": "integer", "minimum": i % 97, "maximum": 1000 + i},
        {"type": "string", "maxLength": 1 + i % 7},
        {"enum": [f"v{i}", f"w{i % 13}", i]},
        {"type": "boolean"},
    ]
    return {"type": "object", "properties": {f"k{i}": kinds[i % 4], f"x{i % 17}": kinds[(i + 1) % 4]},
            "required": [f"k{i}"], "additionalProperties": False}


def _prompt(i: int):
    import torch

    ids = [256] + list(f"request {i}: ".encode())
    return torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)


class _Scenario:
    """`step(i)` runs call i; `engine()` the engine to count (or None)."""

    def __init__(self, name: str, max_new_tokens: int) -> None:
        import hf_paged

        self.name = name
        self.n = max_new_tokens
        self.tok = _tokenizer()
        self.model = _model()
        self.config = hf_paged.PagedConfig(block_size=16, num_blocks=64)
        if name != "serve":
            hf_paged.wrap(self.model, self.config)
        self.client = self.constraints = None
        if name == "serve":
            from starlette.testclient import TestClient

            from hf_paged import Engine
            from hf_paged.serving import ServerSettings, build_app

            self._engine = Engine(self.model, self.config)
            app = build_app(self._engine, self.tok, ServerSettings(model_name="tiny"))
            self.constraints = app.state.server.preparer.constraints  # the server's ConstraintCache
            self.client = TestClient(app)
            self.client.__enter__()

    def engine(self):
        if self.name == "serve":
            return self._engine
        from hf_paged.api.wrap_state import engine_of

        return engine_of(self.model)

    def step(self, i: int) -> None:
        import hf_paged
        from hf_paged import SamplingParams
        from hf_paged.processors import JSONSchemaLogitsProcessor, RegexLogitsProcessor

        ids, mask = _prompt(i)
        if self.name == "schemas":
            proc = JSONSchemaLogitsProcessor(_schema(i), self.tok)
            self.model.generate(ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=self.n)
        elif self.name == "regexes":
            if i % 2:
                proc = RegexLogitsProcessor(f"(id{i}|[a-z]{{{1 + i % 5}}})-[0-9]{{1,{1 + i % 9}}}", self.tok)
                self.model.generate(ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=self.n)
            else:
                self.model.generate(ids, attention_mask=mask, max_new_tokens=self.n, tokenizer=self.tok,
                                    stop_strings=[f"s{i}", f"{i % 31}x"])
        elif self.name == "sampling":
            params = SamplingParams(max_new_tokens=self.n, do_sample=True, seed=i, temperature=0.5 + (i % 13) / 10,
                                    top_k=(i % 40) or None, top_p=0.5 + (i % 50) / 100)
            self.model.generate_batch([ids[0].tolist()], sampling_params=params)
            self.model.generate(ids, attention_mask=mask, max_new_tokens=self.n, do_sample=True,
                                temperature=0.3 + (i % 7) / 10, top_p=0.9)
        elif self.name == "configs":
            hf_paged.unwrap(self.model)
            dtype = ("auto", "int8", "fp8")[i % 3]
            hf_paged.wrap(self.model, self.config.with_overrides(block_size=(8, 16, 32)[i % 3], kv_cache_dtype=dtype))
            self.model.generate(ids, attention_mask=mask, max_new_tokens=self.n)
        elif self.name == "tokenizers":
            tok = _tokenizer()
            proc = JSONSchemaLogitsProcessor(_schema(i % 4), tok)
            self.model.generate(ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=self.n)
        elif self.name == "serve":
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"call {i}"}],
                    "max_tokens": self.n, "temperature": 0, "user": f"user-{i}",
                    "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": _schema(i)}}}
            response = self.client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                raise RuntimeError(f"serve call {i}: HTTP {response.status_code}: {response.text[:300]}")
        else:
            raise ValueError(f"unknown scenario {self.name!r}; choose from {SCENARIOS}")

    def close(self) -> None:
        if self.client is not None:
            self.client.__exit__(None, None, None)


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (calls, value) per 1,000 calls."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def _at(checkpoints: list[dict], calls: int) -> dict:
    """The first checkpoint at or past `calls`."""
    return next(c for c in checkpoints if c["calls"] >= calls)


def run_scenario(name: str, calls: int, every: int, warmup: int, trace: bool, max_new_tokens: int,
                 trim: bool = False) -> dict:
    import torch

    torch.set_num_threads(1)
    scenario = _Scenario(name, max_new_tokens)
    if trace:
        tracemalloc.start(1)
    checkpoints: list[dict] = []
    base_snapshot = None
    start_cpu = time.process_time()
    for i in range(calls + 1):
        if i % every == 0:
            gc.collect()
            if trim:  # memory freed but kept by the C allocator goes back: what is left is live
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            point = {"calls": i, "rss_mb": rss_bytes() / 2**20, "sizes": cache_sizes(scenario.engine(), scenario.constraints)}
            if trace:
                point["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
                if i >= warmup and base_snapshot is None:
                    base_snapshot = tracemalloc.take_snapshot()
            checkpoints.append(point)
            print(json.dumps(point), file=sys.stderr, flush=True)
        if i < calls:
            scenario.step(i)
    top: list[str] = []
    if trace and base_snapshot is not None:
        gc.collect()
        diff = tracemalloc.take_snapshot().compare_to(base_snapshot, "lineno")
        top = [f"{d.traceback[0].filename.replace(ROOT + '/', '')}:{d.traceback[0].lineno} "
               f"{d.size_diff / 1024:+.1f} KiB ({d.count_diff:+d} blocks)" for d in diff[:8]]
    scenario.close()
    after = [c for c in checkpoints if c["calls"] >= warmup]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    return {
        "scenario": name,
        "commit": commit or "?",  # (a copy of a tree outside git: '?')
        "calls": calls,
        "cpu_s": time.process_time() - start_cpu,
        "rss_start_mb": checkpoints[0]["rss_mb"],
        "rss_warm_mb": after[0]["rss_mb"] if after else None,
        "rss_end_mb": checkpoints[-1]["rss_mb"],
        "rss_slope_mb_per_1k": _slope([(c["calls"], c["rss_mb"]) for c in after]),
        # a one-time step (a module imported late, an allocator arena) weighs in the slope: the last half alone
        "rss_last_half_mb": checkpoints[-1]["rss_mb"] - _at(checkpoints, calls // 2)["rss_mb"],
        "traced_slope_mb_per_1k": _slope([(c["calls"], c["traced_mb"]) for c in after]) if trace else None,
        "sizes_warm": after[0]["sizes"] if after else {},
        "sizes_end": checkpoints[-1]["sizes"],
        "top_growth": top,
    }


# -- driver -------------------------------------------------------------------------------------------------------
def _render(results: list[dict], args, label: str) -> str:
    import torch

    from benchmarks.common import machine

    commit = ", ".join(sorted({r.get("commit", "?") for r in results}))
    load = os.getloadavg()
    flags = (" --tracemalloc" if args.tracemalloc else "") + (" --malloc-trim" if args.malloc_trim else "")
    command = (f"OMP_NUM_THREADS=1 python benchmarks/soak_memory.py --calls {args.calls} --every {args.every} "
               f"--warmup {args.warmup} --max-new-tokens {args.max_new_tokens}{flags}")
    header = ("| scenario | calls | CPU s | RSS start MB | RSS at warm-up MB | RSS end MB | RSS slope MB / 1k calls | "
              "RSS growth over the last half MB | traced slope MB / 1k |")
    lines = [f"### {label}: commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             (f"`{command}`; {machine()}; load average {load[0]:.2f} / {load[1]:.2f} (2 cores shared with other "
              f"helpers); torch {torch.__version__}"), "", header, "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        traced = f"{r['traced_slope_mb_per_1k']:+.3f}" if r["traced_slope_mb_per_1k"] is not None else "-"
        lines.append(f"| {r['scenario']} | {r['calls']} | {r['cpu_s']:.0f} | {r['rss_start_mb']:.0f} | "
                     f"{r['rss_warm_mb']:.0f} | {r['rss_end_mb']:.0f} | {r['rss_slope_mb_per_1k']:+.2f} | "
                     f"{r.get('rss_last_half_mb', float('nan')):+.1f} | {traced} |")
    lines += ["", "Structure sizes at warm-up -> end (only those that changed):", ""]
    for r in results:
        changed = [f"{k} {r['sizes_warm'].get(k)} -> {v}" for k, v in r["sizes_end"].items()
                   if r["sizes_warm"].get(k) != v]
        lines.append(f"- {r['scenario']}: " + (", ".join(changed) if changed else "none changed"))
        for t in r["top_growth"][:5]:
            lines.append(f"  - {t}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=1000, help="calls before the slope is measured")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--malloc-trim", action="store_true",
                        help="glibc malloc_trim(0) before each RSS reading: freed memory the allocator kept goes back")
    parser.add_argument("--out", help="append the results table to this markdown file")
    parser.add_argument("--label", default="run")
    parser.add_argument("--log-dir", default="/tmp/soak_memory", help="each scenario's checkpoints and warnings")
    parser.add_argument("--json-out", help="append each scenario's result (one JSON line) to this file")
    parser.add_argument("--render", help="only print the table of the results in this --json-out file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = run_scenario(args.child, args.calls, args.every, args.warmup, args.tracemalloc, args.max_new_tokens,
                              args.malloc_trim)
        print(json.dumps(result))
        print("result " + json.dumps(result), file=sys.stderr)
        return
    if args.render:  # tables from results saved with --json-out (several drivers, one table)
        with open(args.render) as f:
            results = [json.loads(line) for line in f if line.strip()]
        text = _render(results, args, args.label)
        print(text)
        if args.out:
            with open(args.out, "a") as f:
                f.write("\n" + text)
        return
    results = []
    for name in args.scenario:  # a fresh process per scenario
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--calls", str(args.calls), "--every",
               str(args.every), "--warmup", str(args.warmup), "--max-new-tokens", str(args.max_new_tokens)]
        cmd += ["--tracemalloc"] if args.tracemalloc else []
        cmd += ["--malloc-trim"] if args.malloc_trim else []
        os.makedirs(args.log_dir, exist_ok=True)
        with open(os.path.join(args.log_dir, f"{name}.log"), "w") as log:  # checkpoints and warnings
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, check=False,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            raise SystemExit(f"scenario {name} failed (exit {done.returncode})")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
        if args.json_out:
            with open(args.json_out, "a") as f:
                f.write(json.dumps(results[-1]) + "\n")
    text = _render(results, args, args.label)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
