"""`hf-paged demo`: a small mixed workload through the wrapped model and through stock `generate`, one table.

Workload (on the embedded default model, offline): a shared system prompt with many questions, JSON extraction
under a schema, and a few long prompts. Stock `generate` runs the same requests in left-padded batches of 16
(the JSON ones with the same `JSONSchemaLogitsProcessor`); hf_paged runs them all through `generate_batch`.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass

import torch

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 16},
    },
    "required": ["name", "age"],
    # a closed record: JSON Schema (and the processors' default) would let more keys follow, and a 2.3M-parameter
    # model wanders into them (`"the" : 100, "the" : 100, ...` until max_new_tokens: 3/8 valid instead of 8/8)
    "additionalProperties": False,
}
_PEOPLE = [("Ada", 36, "London"), ("Grace", 45, "Arlington"), ("Linus", 21, "Helsinki"), ("Guido", 39, "Haarlem"),
           ("Barbara", 50, "Boston"), ("Ken", 41, "Murray Hill"), ("Margaret", 33, "Cambridge"), ("Dennis", 30, "Bronx")]


@dataclass(slots=True)
class DemoRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    kind: str  # "question", "json", "long"


@dataclass(slots=True)
class MethodResult:
    seconds: float
    tokens: int  # generated tokens (up to and including EOS)
    outputs: list[list[int]]
    kv_bytes: int  # peak KV bytes held


def load_model():
    """The trained default model, or a tiny random Llama (said so) when the checkpoint is not installed."""
    from hf_paged.api.models import DEFAULT_MODEL_PATH, default_model

    if (DEFAULT_MODEL_PATH / "model.safetensors").exists():
        model, tokenizer = default_model()
        return model, tokenizer, f"the embedded default model ({_num_params(model)} parameters, fp32, CPU)"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=259, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=256, eos_token_id=257, pad_token_id=258)
    model = LlamaForCausalLM(config).eval()
    return model, None, (f"a tiny RANDOMLY INITIALISED Llama ({_num_params(model)} parameters, fp32, CPU): the trained "
                         "default model is not installed, so outputs are noise and JSON extraction is skipped")


def _num_params(model) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M"


def build_workload(tokenizer, vocab: int, num_questions: int = 12) -> list[DemoRequest]:
    from hf_paged.cli.datasets import stdlib_documents

    docs = stdlib_documents("heldout")
    text = "".join(d.text for d in docs[:40])

    def encode(s: str) -> list[int]:
        if tokenizer is not None:
            return tokenizer(s)["input_ids"]
        return [b % vocab for b in s.encode()]

    system = "You are a Python expert. Answer briefly.\n" + text[:300] + "\n"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("def ")][:num_questions]
    requests = [DemoRequest(encode(f"{system}Q: what does `{ln}` do?\nA:"), 24, "question") for ln in lines]
    for i in range(2):
        requests.append(DemoRequest(encode(text[2000 + 1500 * i: 2800 + 1500 * i]), 32, "long"))
    if tokenizer is not None:
        for name, age, city in _PEOPLE:
            prompt = f"Record: {name} is {age} and lives in {city}.\nJSON: "
            requests.append(DemoRequest(encode(prompt), 96, "json"))
    return requests


def run_demo(progress: bool = True) -> str:
    """Both runs on one torch thread: on a machine shared with other jobs, several threads of tiny matmuls spin and
    wait on each other, and stock's time swung 3-30x between identical runs (the embedded model gains nothing from
    more threads anyway)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_demo(progress)
    finally:
        torch.set_num_threads(threads)


def _run_demo(progress: bool) -> str:
    from hf_paged import PagedConfig, SamplingParams, engine_of, unwrap, wrap

    start_all = time.perf_counter()
    model, tokenizer, note = load_model()
    vocab = model.config.vocab_size
    requests = build_workload(tokenizer, vocab)
    eos = model.generation_config.eos_token_id
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    json_proc = None
    if tokenizer is not None and any(r.kind == "json" for r in requests):
        from hf_paged.processors import JSONSchemaLogitsProcessor

        json_proc = JSONSchemaLogitsProcessor(PERSON_SCHEMA, tokenizer)
        json_proc.compiled  # noqa: B018 -- the schema's compile (and a fresh install's one-time numba compile) before either clock
    stock = _run_stock(model, requests, json_proc, eos, pad, progress)
    wrap(model, PagedConfig(block_size=16, max_num_batched_tokens=512))
    try:
        engine_of(model)  # set-up before the clock, as the stock model's: the engine (and the CPU attention kernels,
        # compiled once per install, loaded from numba's cache after)
        params = [SamplingParams(max_new_tokens=r.max_new_tokens, eos_token_id=eos,
                                 logits_processors=[json_proc] if r.kind == "json" else []) for r in requests]
        gc.collect()  # (each clock starts after a full collection: a pause of ~0.2 s otherwise lands in either run)
        t0 = time.perf_counter()
        outs = model.generate_batch([r.prompt_ids for r in requests], sampling_params=params, progress_bar=progress)
        seconds = time.perf_counter() - t0
        stats = engine_of(model).stats()
    finally:
        unwrap(model)
    generated = [o.generated_tokens for o in outs.values()]
    paged = MethodResult(seconds, sum(map(len, generated)), generated,
                         stats["peak_blocks_used"] * stats["kv_bytes_per_block"])
    return _table(note, requests, stock, paged, stats, tokenizer, time.perf_counter() - start_all)


def _run_stock(model, requests, json_proc, eos, pad, progress) -> MethodResult:
    from tqdm.auto import tqdm

    from hf_paged.cli.workloads import left_pad

    outputs: list[list[int] | None] = [None] * len(requests)
    kv_peak = 0
    per_token = _kv_bytes_per_token(model)
    gc.collect()
    t0 = time.perf_counter()
    groups = [[i for i, r in enumerate(requests) if r.kind == kind] for kind in ("question", "long", "json")]
    batches = [g[s:s + 16] for g in groups for s in range(0, len(g), 16)]
    for batch in tqdm(batches, desc="stock generate", disable=not progress, unit="batch"):
        ids, mask = left_pad([requests[i].prompt_ids for i in batch], pad)
        width = ids.shape[1]
        new = max(requests[i].max_new_tokens for i in batch)
        procs = [json_proc] if requests[batch[0]].kind == "json" else None
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad, logits_processor=procs)
        kv_peak = max(kv_peak, len(batch) * (width + new) * per_token)
        for row, i in enumerate(batch):
            outputs[i] = _until_eos(out[row, width:width + requests[i].max_new_tokens].tolist(), eos)
    seconds = time.perf_counter() - t0
    return MethodResult(seconds, sum(map(len, outputs)), outputs, kv_peak)


def _until_eos(tokens: list[int], eos) -> list[int]:
    eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
    for k, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: k + 1]
    return tokens


def _kv_bytes_per_token(model) -> int:
    from hf_paged.cache.sizing import kv_shape_of

    shape = kv_shape_of(model.config)
    return shape.bytes_per_block(1, next(model.parameters()).dtype)


def _json_valid_share(requests, outputs, tokenizer) -> str:
    rows = [o for r, o in zip(requests, outputs) if r.kind == "json"]
    if not rows:
        return "n/a (no tokenizer)"
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    valid = 0
    for tokens in rows:
        try:
            doc = json.loads(tokenizer.decode(tokens, skip_special_tokens=True))
            if jsonschema is not None:
                jsonschema.validate(doc, PERSON_SCHEMA)
            valid += 1
        except Exception:  # noqa: BLE001, S110 -- any failure (parse or schema) counts as invalid
            pass
    how = "schema-valid" if jsonschema is not None else "parse"
    return f"{valid}/{len(rows)} {how}"


def _table(note, requests, stock, paged, stats, tokenizer, total_seconds) -> str:
    same = sum(a == b for a, b in zip(stock.outputs, paged.outputs))
    lines = [
        f"model: {note}",
        (f"workload: {sum(r.kind == 'question' for r in requests)} questions after one shared system prompt, "
         f"{sum(r.kind == 'json' for r in requests)} JSON extractions, {sum(r.kind == 'long' for r in requests)} "
         f"long prompts; {sum(len(r.prompt_ids) for r in requests)} prompt tokens"),
        "",
        "| metric                         | stock generate (batches of 16) | hf_paged generate_batch |",
        "|--------------------------------|--------------------------------|-------------------------|",
        f"| seconds                        | {stock.seconds:>30.2f} | {paged.seconds:>23.2f} |",
        f"| generated tokens / s           | {stock.tokens / stock.seconds:>30.0f} | {paged.tokens / paged.seconds:>23.0f} |",
        f"| speed-up                       | {'1.00x':>30} | {stock.seconds / paged.seconds:>22.2f}x |",
        f"| prefix-cache hit rate          | {'-':>30} | {stats['prefix_hit_rate']:>23.0%} |",
        f"| peak KV bytes                  | {stock.kv_bytes:>30,} | {paged.kv_bytes:>23,} |",
        f"| KV bytes vs dense              | {'100%':>30} | {paged.kv_bytes / max(stock.kv_bytes, 1):>23.0%} |",
        (f"| JSON outputs valid             | {_json_valid_share(requests, stock.outputs, tokenizer):>30} | "
         f"{_json_valid_share(requests, paged.outputs, tokenizer):>23} |"),
        f"| outputs identical to stock     | {'-':>30} | {f'{same}/{len(requests)}':>23} |",
        "",
        f"total time {total_seconds:.1f} s (model load, both runs, schema compile); one torch thread, wall clock",
    ]
    text = "\n".join(lines)
    print(text)
    return text
