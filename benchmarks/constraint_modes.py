"""Mask work saved by `constraint_mode="resample"`: masks per constrained token and CPU time per token, side by side
with mask mode in one run.

Model: `hf_paged.default_model()` (the embedded byte-level Llama trained on Python sources), 8 code prompts, 64 new
tokens each, one `Engine` per run, torch on one thread. Constraints, from one the model's free output follows to
one it does not:
  - code:  `[A-Za-z0-9_ .,:()\\[\\]='"\\n]{0,200}`: Python-looking characters (the model's text, mostly);
  - lines: `([a-z_ .()=,']{1,60}\\n){1,3}`: up to three short lower-case lines;
  - json:  a JSON Schema object `{"name": string, "size": integer}` (the model never saw JSON: a control).
Each constraint runs greedy and sampled (temperature 1, seed 0), in mask and in resample mode. Every run gets a
fresh `IndexCache`, so both modes pay the first visits of the automaton's states; a warm-up pass of everything
comes first (the walks' one-time compile). Reported per mode, medians of `--repeats` runs:
  - masks / token: constraint masks computed per sampled constrained token (mask mode: 1.00);
  - refused: share of resample draws the constraint refused (each cost a mask and a second pick);
  - sampler us/token: CPU time inside the engine's sampler per generated token (where masks are applied);
  - engine us/token: CPU time of the whole run per generated token (forwards included);
  - same tokens: greedy outputs identical to mask mode's (sampled runs draw differently: same distribution).
Jump-forward (tokens a constraint forces) runs in both modes and reads the states' memoised masks.

A second table isolates the sampler over GPT-2's 50,257-token vocabulary (`--tokenizer`), where a mask costs
more: 8 requests, 128 steps, random logits (temperature 1), each request's own sampled token appended per step;
a string body (`"[^"\\]{0,4000}`: nearly every token allowed, so random draws nearly always comply) and digits
(`[0-9]{1,4000}`: few allowed, nearly every draw refused: resample's worst case).

Usage:
    python benchmarks/constraint_modes.py [--repeats 3] [--out benchmarks/constraint_modes_results.md]
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

from benchmarks.common import machine, print_table
from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, RegexLogitsProcessor, SamplingParams
from hf_paged.api.models import default_model
from hf_paged.batching.sampler import Sampler
from hf_paged.processors import IndexCache

DEFAULT_TOKENIZER = os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers", "gpt2")
SAMPLER_CONSTRAINTS = {"string body": r'"[^"\\]{0,4000}', "digits": r"[0-9]{1,4000}"}
PROMPTS = [
    "import os\nimport sys\n",
    "def main():\n    ",
    "class Foo(object):\n    def __init__(self):\n        self.",
    "    return ",
    "for i in range(10):\n    ",
    "if __name__ == '__main__':\n    ",
    "x = self.",
    "        self.assertEqual(",
]
CONSTRAINTS: dict[str, str | dict] = {
    "code": r"[A-Za-z0-9_ .,:()\[\]='" + '"' + r"\n]{0,200}",
    "lines": r"([a-z_ .()=,']{1,60}\n){1,3}",
    "json": {"type": "object", "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
             "required": ["name", "size"]},
}


class TimedSampler(Sampler):
    """The engine's sampler, with the CPU time spent in it."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_s = 0.0

    def __call__(self, requests, logits):
        start = time.process_time()
        try:
            return super().__call__(requests, logits)
        finally:
            self.cpu_s += time.process_time() - start


@dataclass(slots=True)
class Run:
    tokens: list[list[int]]
    num_tokens: int
    constrained_tokens: int
    masks: int
    rejections: int
    sampler_s: float
    engine_s: float


def run_once(model, tok, constraint, mode: str, sample: bool, max_new_tokens: int) -> Run:
    cache = IndexCache()  # cold: both modes pay the first visits of the states they reach
    if isinstance(constraint, dict):
        proc = JSONSchemaLogitsProcessor(constraint, tok, index_cache=cache)
    else:
        proc = RegexLogitsProcessor(constraint, tok, index_cache=cache)
    engine = Engine(model, PagedConfig())
    # the step's sampling holds the sampler it was built with (`StepSampling`); the stats read `engine.sampler`:
    # both must be the timed one, or the table reads an idle sampler's zeros
    sampler = engine.sampler = engine.sampling.sampler = TimedSampler()
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=model.generation_config.eos_token_id,
                            logits_processors=[proc], constraint_mode=mode, do_sample=sample, seed=0)
    start = time.process_time()
    ids = [engine.add_request(tok(p)["input_ids"], params) for p in PROMPTS]
    outs = engine.run(ids)
    engine_s = time.process_time() - start
    for rid in ids:
        if outs[rid].error:
            raise RuntimeError(f"request {rid} failed: {outs[rid].error}")
    stats = engine.stats()
    tokens = [outs[rid].generated_tokens for rid in ids]
    return Run(tokens, sum(map(len, tokens)), stats["constrained_tokens"], stats["masks_computed"],
               stats["resample_rejections"], sampler.cpu_s, engine_s)


def sampler_run(tok, regex: str, mode: str, steps: int, rows: int = 8) -> tuple[float, float, float]:
    """(sampler CPU us per token, masks per token, refused share) of `steps` steps of `rows` requests."""
    from hf_paged.batching.request import Request

    proc = RegexLogitsProcessor(regex, tok, index_cache=IndexCache())
    proc.compiled  # noqa: B018 -- the compile, before the clock
    sampler = TimedSampler()
    params = SamplingParams(do_sample=True, seed=0, logits_processors=[proc], constraint_mode=mode, max_new_tokens=steps)
    requests = [Request(f"r{i}", [0], params) for i in range(rows)]
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for _ in range(steps):
            logits = torch.randn(rows, len(tok), generator=g)
            out = sampler(requests, logits)
            for request, token in zip(requests, out.token_ids):
                request.output_ids.append(token)
    stats = sampler.constraint_stats
    n = stats.num_constrained_tokens
    return sampler.cpu_s / n * 1e6, stats.num_masks_computed / n, stats.num_rejections / n


def sampler_table(tokenizer_path: str, repeats: int) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    for name, regex in SAMPLER_CONSTRAINTS.items():  # warm-up
        for mode in ("mask", "resample"):
            sampler_run(tok, regex, mode, 4)
    rows = []
    for name, regex in SAMPLER_CONSTRAINTS.items():
        for mode in ("mask", "resample"):
            done = [sampler_run(tok, regex, mode, 128) for _ in range(repeats)]
            rows.append([name, mode, f"{done[0][1]:.2f}", f"{100 * done[0][2]:.1f}%" if mode == "resample" else "-",
                         f"{statistics.median(d[0] for d in done):.0f}"])
    return print_table(["constraint", "mode", "masks / token", "refused", "sampler us/token"], rows,
                       f"sampler alone, GPT-2 vocabulary ({len(tok)} tokens), 8 rows x 128 steps, median of {repeats}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="for the sampler table ('' to skip it)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = default_model()
    grid = [(name, sample, mode) for name in CONSTRAINTS for sample in (False, True) for mode in ("mask", "resample")]
    for name, sample, mode in grid:  # warm-up: the walks' compile, the allocator, the CPU kernels
        run_once(model, tok, CONSTRAINTS[name], mode, sample, 8)
    runs: dict[tuple, list[Run]] = {key: [] for key in grid}
    for _ in range(args.repeats):  # interleaved: a busy moment of the machine touches every configuration
        for key in grid:
            runs[key].append(run_once(model, tok, CONSTRAINTS[key[0]], key[2], key[1], args.max_new_tokens))
    rows = []
    for name, sample, mode in grid:
        done = runs[(name, sample, mode)]
        first = done[0]
        masked = runs[(name, sample, "mask")][0]
        rows.append([
            name, "sampled" if sample else "greedy", mode, first.num_tokens,
            f"{first.masks / max(first.constrained_tokens, 1):.2f}",
            f"{100 * first.rejections / max(first.constrained_tokens, 1):.1f}%" if mode == "resample" else "-",
            f"{statistics.median(r.sampler_s / r.num_tokens for r in done) * 1e6:.0f}",
            f"{statistics.median(r.engine_s / r.num_tokens for r in done) * 1e6:.0f}",
            ("yes" if first.tokens == masked.tokens else "NO") if not sample else "-",
        ])
    headers = ["constraint", "decoding", "mode", "tokens", "masks / token", "refused", "sampler us/token",
               "engine us/token", "same tokens"]
    title = (f"constraint_modes: default model, {len(PROMPTS)} prompts x {args.max_new_tokens} new tokens, "
             f"median of {args.repeats}; {machine()}")
    text = print_table(headers, rows, title)
    if args.tokenizer:
        text += "\n\n" + sampler_table(args.tokenizer, args.repeats)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
