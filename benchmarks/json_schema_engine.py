"""Engine cost of JSON-schema constrained decoding: time per generated token, constrained vs unconstrained.

Same model, same 8 prompts, greedy, one `Engine` per run. Three runs per model, each repeated `--repeats` times
(the median is reported):
  - unconstrained: no processor, no EOS, so every request generates exactly `--max-new-tokens` tokens;
  - constrained, jump-forward OFF: `JSONSchemaLogitsProcessor` with `forced_tokens` hidden, so the engine
    decodes every token (the processor's cost alone, issue 5's "before jump-forward gains");
  - constrained, jump-forward ON: the stock processor; forced tokens are appended without a decode step each.
The schema ends in a free-text string field, so a random model stays inside it until `--max-new-tokens`: the
constrained requests generate as many tokens as the unconstrained ones (checked and printed). A warm-up run of
each kind comes first (index compile, vocabulary trie, first visits of the automaton's states): the timed runs
measure steady-state decoding with a compiled, warm index, which is what a served schema costs per token.

Models: (a) a tiny random GPT-2 (n_layer=2, n_embd=64) over the 50,257-token GPT-2 vocabulary (as in
`json_schema.py`); (b) `hf_paged.default_model()` with its byte tokenizer. Times are the main thread's CPU time
(torch runs single-threaded here, so that is all the compute) and wall clock.

Usage:
    python benchmarks/json_schema_engine.py --out benchmarks/json_schema_engine_results.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import machine
from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, SamplingParams
from hf_paged.processors import IndexCache

DEFAULT_TOKENIZER = os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers", "gpt2")

# a Glaive-style function call whose last argument is free text
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"enum": ["send_email", "create_note"]},
        "arguments": {
            "type": "object",
            "properties": {
                "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                "urgent": {"type": "boolean"},
                "body": {"type": "string"},
            },
            "required": ["priority", "urgent", "body"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
PROMPTS = [
    "Call a function to email Bob:",
    "JSON:",
    "Write a note about the weekly meeting and its agenda.",
    "{",
    "Function call for a reminder",
    "Please respond with a JSON object",
    "The tool call is",
    "Note:",
]


class NoJumpForward(JSONSchemaLogitsProcessor):
    """The stock processor with jump-forward hidden from the engine (it looks `forced_tokens` up by name)."""

    forced_tokens = None


@dataclass(slots=True)
class RunResult:
    """One engine run over the batch."""

    cpu_s: float  # main-thread CPU time of `engine.run`
    wall_s: float
    num_tokens: int  # generated tokens, all requests
    num_steps: int  # engine steps
    num_forced: int  # tokens appended by jump-forward


def run_once(model, tok, max_new_tokens: int, processor) -> RunResult:
    engine = Engine(model, PagedConfig(block_size=16))
    if processor is None:
        params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=None)
    else:
        params = SamplingParams(
            max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id, logits_processors=[processor]
        )
    ids = [engine.add_request(tok(p)["input_ids"], params) for p in PROMPTS]
    wall, cpu = time.perf_counter(), time.thread_time()
    outs = engine.run(ids)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    stats = engine.stats()
    for rid in ids:
        if outs[rid].error:
            raise RuntimeError(f"request {rid} failed: {outs[rid].error}")
    return RunResult(cpu, wall, sum(len(outs[r].generated_tokens) for r in ids), stats["steps"], stats["forced_tokens"])


def bench_model(label: str, model, tok, max_new_tokens: int, repeats: int) -> dict:
    cache = IndexCache(max_compile_s=120)
    kinds = {
        "unconstrained": lambda: None,
        "constrained, jump-forward off": lambda: NoJumpForward(SCHEMA, tok, index_cache=cache),
        "constrained, jump-forward on": lambda: JSONSchemaLogitsProcessor(SCHEMA, tok, index_cache=cache),
    }
    results: dict[str, list[RunResult]] = {k: [] for k in kinds}
    for kind, make in kinds.items():  # warm-up: compile, trie, first visits of the states
        run_once(model, tok, max_new_tokens, make())
    for _ in range(repeats):  # interleaved, so slow phases of a shared machine hit every kind alike
        for kind, make in kinds.items():
            results[kind].append(run_once(model, tok, max_new_tokens, make()))
    base = statistics.median(r.cpu_s / r.num_tokens for r in results["unconstrained"])
    base_wall = statistics.median(r.wall_s / r.num_tokens for r in results["unconstrained"])
    rows = {}
    for kind, runs in results.items():
        cpu = statistics.median(r.cpu_s / r.num_tokens for r in runs)
        wall = statistics.median(r.wall_s / r.num_tokens for r in runs)
        rows[kind] = {
            "ms_per_token_cpu": cpu * 1e3,
            "ms_per_token_wall": wall * 1e3,
            "ratio_cpu": cpu / base,
            "ratio_wall": wall / base_wall,
            "tokens": runs[0].num_tokens,
            "steps": runs[0].num_steps,
            "forced": runs[0].num_forced,
        }
    print(f"{label}: " + ", ".join(f"{k} {v['ms_per_token_cpu']:.3f} ms/token" for k, v in rows.items()), flush=True)
    return rows


def render(args, sections: dict[str, dict]) -> str:
    lines = [
        "# Engine cost of JSON-schema constrained decoding",
        "",
        (
            f"Machine: {machine()}, load average at start {os.getloadavg()[0]:.1f}. Command: "
            f"`python benchmarks/json_schema_engine.py {' '.join(sys.argv[1:])}`."
        ),
        (
            f"Batch: {len(PROMPTS)} requests, greedy, max_new_tokens={args.max_new_tokens}, median of "
            f"{args.repeats} interleaved runs after one warm-up run of each kind (compiled index, warm state memo). "
            "Time per generated token = `engine.run` time / generated tokens; CPU = main-thread CPU time (torch "
            "single-threaded)."
        ),
        "",
        (
            "| model | run | tokens | engine steps | forced tokens (steps saved) | CPU ms/token | "
            "x unconstrained (CPU) | wall ms/token | x unconstrained (wall) |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in sections.items():
        for kind, r in rows.items():
            lines.append(
                f"| {label} | {kind} | {r['tokens']} | {r['steps']} | {r['forced']} | {r['ms_per_token_cpu']:.3f} | "
                f"{r['ratio_cpu']:.3f} | {r['ms_per_token_wall']:.3f} | {r['ratio_wall']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="gpt2-tiny,default", help="comma-separated: gpt2-tiny, default")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    sections = {}
    for name in args.models.split(","):
        if name == "gpt2-tiny":
            from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

            tok = AutoTokenizer.from_pretrained(args.tokenizer)
            config = GPT2Config(
                n_layer=2, n_embd=64, n_head=2, vocab_size=len(tok), n_positions=1024,
                eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
            )  # fmt: skip
            model = GPT2LMHeadModel(config).eval()
            label = "tiny random GPT-2 (2 x 64, vocab 50,257)"
        elif name == "default":
            from hf_paged import default_model

            model, tok = default_model()
            label = f"hf_paged.default_model() (byte tokenizer, vocab {len(tok)})"
        else:
            parser.error(f"unknown model {name!r}: use gpt2-tiny or default")
        with torch.inference_mode():
            sections[label] = bench_model(label, model, tok, args.max_new_tokens, args.repeats)
    report = render(args, sections)
    print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
