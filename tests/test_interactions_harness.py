"""Features together: a seeded all-pairs covering set over engine and request options, and the checks each
combination must pass (`tests/test_interactions.py` runs it). No tests here: the generator, the runner and the
oracle.

Expectations per combination:
- lossless engine options (block size, prefix hits, chunking, preemption by recompute or swap, the disk tier,
  speculative decoding, the certified head) with greedy decoding: token-identical to stock `generate` with the same
  processors, stop strings and EOS ids (the master test);
- seeded sampling: identical across two runs, and (lossless options) identical to the same requests on a plain
  engine (README "Sampling and seeds": not the batch, block size, chunking, preemption, prefix hits or drafts);
- lossy options (a quantized KV cache, token pruning, streaming heads): the same output twice;
- constrained requests that end with "stop": the text is a valid document;
- an unsupported pair: a typed error naming both features, or `PagedFallbackWarning` on `generate`.
Every run is bounded by its step count (Engine) or its token budget (generate).
"""

from __future__ import annotations

import json
import random
import re
import warnings
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, RepetitionPenaltyLogitsProcessor
from transformers.generation.stopping_criteria import StoppingCriteria

MAX_POSITIONS = 128
PAD = 94  # byte 0xa1 of the byte tokenizer: generate's pad (no document allows it), so EOS and padding differ
MAX_STEPS = 400  # no combination needs more engine steps than this (prompts <= 125 tokens, <= 12 new each)

FACTORS: dict[str, list[Any]] = {
    "entry": ["engine", "generate_batch", "generate"],
    "block_size": [4, 16],
    "prefix": ["off", "hit"],
    "chunk": ["none", "small"],
    "pool": ["big", "tiny", "tiny_swap"],
    "kv": ["auto", "int8", "int4", "fp8"],
    "lossy": ["none", "pruning", "streaming_heads"],
    "spec": ["none", "lookup", "draft"],
    "certified": [None, True],
    "offload": [False, True],
    "sampling": ["greedy", "seeded"],
    "n": [1, 2],
    "logprobs": [None, 3],
    "stop": ["none", "string", "criteria"],
    "constraint": ["none", "json", "regex", "choice"],
    "custom_proc": [False, True],
    "rep_penalty": [False, True],
    "scores": [False, True],
    "max_new": [1, 12],
    "eos_mid": [False, True],
    "ctx_limit": [False, True],
}


def unsupported(combo: dict[str, Any]) -> str | None:
    """The documented refusal this combination meets (README "Speculative decoding" limits, `PagedConfig`'s
    streaming-heads checks), or None."""
    get = combo.get
    if get("spec") not in (None, "none"):
        if get("kv") not in (None, "auto"):
            return "speculative+kv_cache_dtype"
        if get("lossy") == "pruning":
            return "speculative+kv_pruning"
        if get("lossy") == "streaming_heads":
            return "speculative+streaming_heads"
    if get("lossy") == "streaming_heads":
        if get("prefix") == "hit" or get("offload"):
            return "streaming_heads+enable_prefix_caching"
        if get("pool") == "tiny_swap":
            return "streaming_heads+preemption_mode"
    return None


def valid(combo: dict[str, Any]) -> bool:
    """Pairs no user can ask for, and the documented refusals (`unsupported`: checked on their own rows)."""
    get = combo.get
    if get("stop") == "criteria" and get("entry") not in (None, "generate"):
        return False  # stopping criteria are a `generate` argument
    if get("entry") == "generate" and get("sampling") == "greedy" and get("n") == 2:
        return False  # stock refuses greedy num_return_sequences > 1 without beams (a ValueError), as we do
    if get("offload") and get("prefix") == "off":
        return False  # the disk tier is below the prefix cache (refused at construction, tested elsewhere)
    return unsupported(combo) is None


UNSUPPORTED_ROWS = [  # one row per refusal and entry point, the other factors plain
    {"spec": spec, "kv": kv, "lossy": lossy, "prefix": prefix, "pool": pool, "entry": entry}
    for spec, kv, lossy, prefix, pool in (("lookup", "int8", "none", "off", "big"),
                                           ("draft", "fp8", "none", "off", "big"),
                                           ("lookup", "auto", "pruning", "off", "big"),
                                           ("lookup", "auto", "streaming_heads", "off", "big"),
                                           ("none", "auto", "streaming_heads", "hit", "big"),
                                           ("none", "auto", "streaming_heads", "off", "tiny_swap"))
    for entry in ("engine", "generate_batch", "generate")
]


def all_pairs(factors: dict[str, list[Any]], seed: int = 0, candidates: int = 40) -> list[dict[str, Any]]:
    """A small covering set: every valid pair of values of two factors appears in some row (greedy, seeded)."""
    rng = random.Random(seed)
    names = list(factors)
    uncovered = {(a, va, b, vb) for a, b in combinations(names, 2) for va in factors[a] for vb in factors[b]
                 if valid({a: va, b: vb})}
    rows: list[dict[str, Any]] = []
    while uncovered:
        a, va, b, vb = sorted(uncovered, key=repr)[rng.randrange(len(uncovered))]
        best, best_gain = None, -1
        for _ in range(candidates):
            row = {a: va, b: vb}
            for name in rng.sample(names, len(names)):  # each factor a random value that keeps the row valid
                if name not in row:
                    options = [v for v in factors[name] if valid({**row, name: v})]
                    row[name] = rng.choice(options or factors[name])
            row = {name: row[name] for name in names}
            if not valid(row):
                continue
            gain = sum((x, row[x], y, row[y]) in uncovered for x, y in combinations(names, 2))
            if gain > best_gain:
                best, best_gain = row, gain
        if best is None:
            uncovered.discard((a, va, b, vb))
            continue
        rows.append(best)
        uncovered -= {(x, best[x], y, best[y]) for x, y in combinations(names, 2)}
    return rows


# -- the model and the requests ------------------------------------------------------------------------------------


@dataclass
class World:
    tok: Any
    model: Any
    draft: Any
    prompts: list[list[int]]
    limit_prompt: list[int]


def build_world() -> World:
    from tests.tiny_models import byte_tokenizer

    tok = byte_tokenizer()

    def llama(seed: int) -> Any:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.eos_token_id, bos_token_id=None)).eval()
        model.config._attn_implementation = "sdpa"
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = tok.eos_token_id
        return model

    shared = "The quick brown fox jumps over the lazy dog. "  # a long shared prefix (45 bytes)
    prompts = [tok(shared + s)["input_ids"] for s in ("Name: ", "abc abc abc ab", "JSON please: {")]
    limit = tok(("x y z " * 40)[: MAX_POSITIONS - 3])["input_ids"]
    model, draft = llama(0), llama(0)
    with torch.no_grad():  # a draft close to the model: some drafts kept, some rejected
        g = torch.Generator().manual_seed(7)
        for w in draft.parameters():
            w.add_(torch.randn(w.shape, generator=g) * 0.05)
    return World(tok, model, draft, prompts, limit)


class BanToken(LogitsProcessor):
    """A custom processor: never the token `token_id` (a user's own, not one of ours or transformers')."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, self.token_id] = float("-inf")
        return scores


class StopAfter(StoppingCriteria):
    """A stopping criterion: rows stop once they end with byte `token_id` (transformers' per-row form)."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return input_ids[:, -1] == self.token_id


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": False}
REGEX = r"[0-9]{1,3}(-[a-c]{1,2}){0,3}"
CHOICES = ["alpha", "beta", "gamma delta"]


def constraint_processor(world: World, kind: str):
    from hf_paged.processors import ChoiceLogitsProcessor, JSONSchemaLogitsProcessor, RegexLogitsProcessor

    if kind == "none":
        return None
    if kind == "json":
        return JSONSchemaLogitsProcessor(SCHEMA, world.tok)
    if kind == "regex":
        return RegexLogitsProcessor(REGEX, world.tok)
    return ChoiceLogitsProcessor(CHOICES, world.tok)


def request_prompts(world: World, combo: dict[str, Any]) -> list[list[int]]:
    prompts = list(world.prompts)
    if combo["ctx_limit"]:
        prompts[1] = world.limit_prompt
    return prompts


def eos_ids(world: World, combo: dict[str, Any]) -> list[int]:
    ids = [world.tok.eos_token_id]
    if combo["eos_mid"]:  # a handful of common bytes end a request early (each row where it draws one)
        ids += [world.tok.convert_tokens_to_ids(c) for c in "aeiou"]
    return ids


def processors(world: World, combo: dict[str, Any]) -> list:
    procs = []
    if combo["rep_penalty"]:
        procs.append(RepetitionPenaltyLogitsProcessor(1.3))
    if combo["custom_proc"]:
        procs.append(BanToken(world.tok.convert_tokens_to_ids("q")))  # no document needs it
    constraint = constraint_processor(world, combo["constraint"])
    if constraint is not None:
        procs.append(constraint)
    return procs


def paged_config(world: World, combo: dict[str, Any], tmp_dir: str | None):
    from hf_paged import PagedConfig

    bs = combo["block_size"]
    longest = MAX_POSITIONS if combo["ctx_limit"] else max(map(len, world.prompts)) + combo["max_new"] + 4
    per_seq = -(-longest // bs)
    kw: dict[str, Any] = {"block_size": bs, "enable_prefix_caching": combo["prefix"] == "hit",
                              "certified_argmax": combo["certified"]}
    # tiny: two prompts fit, their decodes do not (preemption), the longest request alone does
    two_prompts = 2 * -(-max(map(len, world.prompts)) // bs) + 1
    kw["num_blocks"] = max(per_seq, two_prompts) if combo["pool"] != "big" else 8 * per_seq + 8
    if combo["pool"] == "tiny_swap":
        kw["preemption_mode"] = "swap"
    if combo["chunk"] == "small":
        kw.update(max_num_batched_tokens=24, max_prefill_tokens_per_step=8)
    if combo["kv"] != "auto":
        kw["kv_cache_dtype"] = combo["kv"]
    if combo["lossy"] == "pruning":
        kw.update(kv_pruning="streaming", kv_keep_ratio=0.5, num_sink_tokens=4, window_tokens=8)
    elif combo["lossy"] == "streaming_heads":
        kw.update(kv_streaming_heads=((0,), (1,)), num_sink_tokens=4, window_tokens=8)
    if combo["offload"] and tmp_dir is not None:
        kw["kv_offload_dir"] = tmp_dir
    return PagedConfig(**kw)


def sampling_params(world: World, combo: dict[str, Any]):
    from hf_paged import SamplingParams

    kw: dict[str, Any] = {"max_new_tokens": combo["max_new"], "eos_token_id": eos_ids(world, combo),
                              "logits_processors": processors(world, combo), "num_return_sequences": combo["n"],
                              "logprobs": combo["logprobs"], "output_scores": combo["scores"]}
    if combo["sampling"] == "seeded":
        kw.update(do_sample=True, temperature=0.8, top_k=40, seed=1234)
    if combo["stop"] in ("string", "criteria"):
        kw.update(stop_strings=[" "], tokenizer=world.tok)
    if combo["spec"] != "none":
        kw["num_speculative_tokens"] = 3
        if combo["spec"] == "draft":
            kw["draft_model"] = world.draft
    return SamplingParams(**kw)


# -- running one combination -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one run gave: per prompt, per returned sequence, the new tokens (and what came with them)."""

    tokens: list[list[list[int]]] = field(default_factory=list)
    finish: list[list[str | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # FAILED requests' errors
    raised: BaseException | None = None
    fallback: bool = False  # generate ran stock (PagedFallbackWarning)
    extras_ok: list[str] = field(default_factory=list)  # broken side promises (logprobs / scores counts)


def _engine_config_and_model(world: World, combo: dict[str, Any], tmp_dir: str | None):
    import copy

    return paged_config(world, combo, tmp_dir), copy.deepcopy(world.model)


def _warm(world: World, combo: dict[str, Any]) -> bool:
    return combo["prefix"] == "hit"


def _check_side(out, params, problems: list[str]) -> None:
    n = len(out.generated_tokens)
    if params.logprobs is not None and (out.logprobs is None or len(out.logprobs) != n):
        problems.append(f"{out.request_id}: {n} tokens, logprobs {None if out.logprobs is None else len(out.logprobs)}")
    if params.output_scores and (out.scores is None or len(out.scores) != n):
        problems.append(f"{out.request_id}: {n} tokens, scores {None if out.scores is None else len(out.scores)}")


def run_engine(world: World, combo: dict[str, Any], tmp_dir: str | None) -> Outcome:
    from hf_paged import Engine
    from hf_paged.batching.request import fork_ids

    outcome = Outcome()
    try:
        config, model = _engine_config_and_model(world, combo, tmp_dir)
        engine = Engine(model, config)
        prompts = request_prompts(world, combo)
        if _warm(world, combo):
            engine.run([engine.add_request(prompts[0], sampling_params(world, combo).replace(
                max_new_tokens=2, num_return_sequences=1, num_speculative_tokens=0, draft_model=None))])
        params = [sampling_params(world, combo) for _ in prompts]
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        steps = 0
        while engine.has_unfinished:
            engine.step()
            engine.check_integrity()
            steps += 1
            if steps > MAX_STEPS:
                raise AssertionError(f"no end after {MAX_STEPS} steps (a hang)")
        for rid, sp in zip(ids, params, strict=True):
            outs = [engine.pop_output(f) for f in fork_ids(rid, sp.num_return_sequences)]
            _collect(outcome, outs, sp)
    except Exception as exc:  # noqa: BLE001 -- the outcome records what was raised; the checks judge it
        outcome.raised = exc
    return outcome


def _collect(outcome: Outcome, outs: list, params) -> None:
    outcome.tokens.append([o.generated_tokens for o in outs])
    outcome.finish.append([o.finish_reason for o in outs])
    outcome.errors += [f"{o.request_id}: {o.error}" for o in outs if o.error is not None]
    for o in outs:
        _check_side(o, params, outcome.extras_ok)


def run_generate_batch(world: World, combo: dict[str, Any], tmp_dir: str | None) -> Outcome:
    import hf_paged

    outcome = Outcome()
    try:
        config, model = _engine_config_and_model(world, combo, tmp_dir)
        model = hf_paged.wrap(model, config)
        prompts = request_prompts(world, combo)
        if _warm(world, combo):
            model.generate_batch([prompts[0]], sampling_params=sampling_params(world, combo).replace(
                max_new_tokens=2, num_return_sequences=1, num_speculative_tokens=0, draft_model=None))
        params = sampling_params(world, combo)
        outs = model.generate_batch(prompts, sampling_params=params)
        for i in range(len(prompts)):
            group = [o for name, o in outs.items() if name == f"req_{i}" or name.startswith(f"req_{i}__")]
            _collect(outcome, group, params)
    except Exception as exc:  # noqa: BLE001 -- judged by the checks
        outcome.raised = exc
    return outcome


def generate_kwargs(world: World, combo: dict[str, Any]) -> dict[str, Any]:
    procs = [p for p in processors(world, combo) if not isinstance(p, RepetitionPenaltyLogitsProcessor)]
    kw: dict[str, Any] = {"max_new_tokens": combo["max_new"], "eos_token_id": eos_ids(world, combo),
                              "pad_token_id": PAD, "logits_processor": procs or None,
                              "num_return_sequences": combo["n"], "do_sample": combo["sampling"] == "seeded"}
    if combo["sampling"] == "seeded":
        kw.update(temperature=0.8, top_k=40)
    if combo["rep_penalty"]:
        kw["repetition_penalty"] = 1.3
    if combo["stop"] == "string":
        kw.update(stop_strings=[" "], tokenizer=world.tok)
    elif combo["stop"] == "criteria":
        kw["stopping_criteria"] = [StopAfter(world.tok.convert_tokens_to_ids("\u0120"))]
    if combo["scores"]:
        kw.update(output_scores=True, return_dict_in_generate=True)
    if combo["spec"] == "lookup":
        kw["prompt_lookup_num_tokens"] = 3
    elif combo["spec"] == "draft":
        kw.update(assistant_model=world.draft, num_assistant_tokens=3)
    return kw


def _strip_pads(row: list[int]) -> list[int]:
    while row and row[-1] == PAD:
        row = row[:-1]
    return row


def left_padded(world: World, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    pad = PAD
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def run_generate(world: World, combo: dict[str, Any], tmp_dir: str | None, *, stock: bool = False) -> Outcome:
    import copy

    import hf_paged
    from hf_paged.api.generate import PagedFallbackWarning

    outcome = Outcome()
    try:
        if stock:
            model = copy.deepcopy(world.model)
        else:
            config, model = _engine_config_and_model(world, combo, tmp_dir)
            model = hf_paged.wrap(model, config)
        prompts = request_prompts(world, combo)
        ids, mask = left_padded(world, prompts)
        kw = generate_kwargs(world, combo)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if _warm(world, combo):
                torch.manual_seed(99)
                model.generate(torch.tensor([prompts[0]]), attention_mask=torch.ones(1, len(prompts[0]),
                               dtype=torch.long), **{**kw, "max_new_tokens": 2, "num_return_sequences": 1})
            torch.manual_seed(1234)
            out = model.generate(ids, attention_mask=mask, **kw)
        outcome.fallback = any(issubclass(w.category, PagedFallbackWarning) for w in seen)
        sequences = out.sequences if combo["scores"] else out
        if combo["scores"] and len(out.scores) != sequences.shape[1] - ids.shape[1]:
            outcome.extras_ok.append(f"{len(out.scores)} score steps for {sequences.shape[1] - ids.shape[1]} tokens")
        rows = [_strip_pads(r) for r in sequences[:, ids.shape[1]:].tolist()]
        n = combo["n"]
        outcome.tokens = [rows[i * n:(i + 1) * n] for i in range(len(prompts))]
    except Exception as exc:  # noqa: BLE001 -- judged by the checks
        outcome.raised = exc
    return outcome


RUNNERS = {"engine": run_engine, "generate_batch": run_generate_batch, "generate": run_generate}


# -- the oracle ------------------------------------------------------------------------------------------------


def lossless(combo: dict[str, Any]) -> bool:
    return combo["kv"] == "auto" and combo["lossy"] == "none"


def stock_rows(world: World, combo: dict[str, Any]) -> list[list[list[int]]]:
    """Greedy continuations of stock `generate`, one prompt at a time (no padding), cut at the model's positions."""
    import copy

    if combo["entry"] == "generate":  # the same padded call, each row cut where the positions end (README)
        rows = run_generate(world, {**combo, "spec": "none"}, None, stock=True).tokens
        limits = [max(MAX_POSITIONS - len(p), 1) for p in request_prompts(world, combo)]
        return [[row[:limit] for row in group] for group, limit in zip(rows, limits, strict=True)]
    model = copy.deepcopy(world.model)
    kw = generate_kwargs(world, {**combo, "spec": "none", "n": 1, "scores": False})
    rows = []
    for p in request_prompts(world, combo):
        out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **kw)
        new = out[0, len(p):].tolist()[: max(MAX_POSITIONS - len(p), 1)]
        rows.append([new] * combo["n"])
    return rows


def plain_engine_rows(world: World, combo: dict[str, Any]) -> list[list[list[int]]]:
    """The same requests on a plain engine: block 16, a big pool, no chunking, no prefix cache, no drafts."""
    plain = {**combo, "block_size": 16, "prefix": "off", "chunk": "none", "pool": "big", "spec": "none",
             "certified": None, "offload": False, "entry": "engine"}
    return run_engine(world, plain, None).tokens


def document_ok(world: World, kind: str, tokens: list[int]) -> bool:
    text = world.tok.decode([t for t in tokens if t != world.tok.eos_token_id])
    if kind == "json":
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        return isinstance(doc, dict) and set(doc) == {"a", "b"} and isinstance(doc["a"], int) and doc["b"] in "xy"
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    return text in CHOICES


PLAIN = {"entry": "engine", "block_size": 16, "prefix": "off", "chunk": "none", "pool": "big", "kv": "auto",
         "lossy": "none", "spec": "none", "certified": None, "offload": False, "sampling": "greedy", "n": 1,
         "logprobs": None, "stop": "none", "constraint": "none", "custom_proc": False, "rep_penalty": False,
         "scores": False, "max_new": 12, "eos_mid": False, "ctx_limit": False}


def refusal_problems(world: World, combo: dict[str, Any], reason: str, tmp_dir: str) -> list[str]:
    """A documented refusal: a typed error naming both features (raised, or each request FAILED with it), or on
    `generate` stock's output with a `PagedFallbackWarning`."""
    from hf_paged.errors import HfPagedError

    words = {"speculative": "speculative", "kv_cache_dtype": "kv_cache_dtype", "kv_pruning": "kv_pruning",
             "streaming_heads": "streaming heads", "enable_prefix_caching": "enable_prefix_caching",
             "preemption_mode": "preemption_mode"}
    first, second = (words[w] for w in reason.split("+"))
    out = RUNNERS[combo["entry"]](world, combo, tmp_dir)
    if out.raised is not None:
        text = str(out.raised).replace("kv_streaming_heads", "streaming heads")
        typed = isinstance(out.raised, (ValueError, TypeError, HfPagedError))
        if typed and first in text and second in text:
            return []
        return [f"refused unclearly ({reason}): {type(out.raised).__name__}: {out.raised}"]
    if combo["entry"] == "generate":
        if not out.fallback:
            return [f"generate ran {reason} without a PagedFallbackWarning or an error"]
        return [] if combo["sampling"] != "greedy" or out.tokens == stock_rows(world, combo) else [
            f"fallback output differs from stock ({reason})"]
    if not out.errors or len(out.errors) != sum(map(len, out.tokens)):
        return [f"{reason} ran silently: {out.tokens}"]
    unclear = [e for e in out.errors if not (first in e and second in e)]
    return [f"request errors do not name both features ({reason}): {unclear[0]}"] if unclear else []


def problems_of(world: World, combo: dict[str, Any], tmp_dirs: tuple[str, str]) -> list[str]:
    """Everything this combination gets wrong (empty: it passes)."""
    combo = {**PLAIN, **combo}
    reason = unsupported(combo)
    if reason is not None:
        return refusal_problems(world, combo, reason, tmp_dirs[0])
    run = RUNNERS[combo["entry"]]
    first = run(world, combo, tmp_dirs[0])
    if first.raised is not None:
        return [f"raised {type(first.raised).__name__}: {first.raised}"]
    problems = [f"failed: {e}" for e in first.errors] + [f"side: {e}" for e in first.extras_ok]
    if combo["constraint"] != "none":
        for i, rows in enumerate(first.tokens):
            for j, tokens in enumerate(rows):
                reason_ = first.finish[i][j] if first.finish else None
                ended = tokens and tokens[-1] == world.tok.eos_token_id and reason_ in (None, "stop")
                if ended and not document_ok(world, combo["constraint"], tokens):
                    problems.append(f"invalid {combo['constraint']} document: {world.tok.decode(tokens)!r} "
                                    f"({reason_})")
    if combo["sampling"] == "greedy" and lossless(combo):
        expected = stock_rows(world, combo)
        if first.tokens != expected:
            problems.append(f"greedy differs from stock: {first.tokens} vs {expected}")
        return problems
    second = run(world, combo, tmp_dirs[1])
    if second.raised is not None or second.tokens != first.tokens:
        problems.append(f"not deterministic: {first.tokens} vs "
                        f"{second.tokens if second.raised is None else second.raised}")
    if combo["sampling"] == "seeded" and lossless(combo) and combo["entry"] != "generate":
        expected = plain_engine_rows(world, combo)
        if first.tokens != expected:
            problems.append(f"seeded differs from a plain engine's: {first.tokens} vs {expected}")
    return problems
