"""KV compression benchmark: quantized blocks and token eviction on the embedded trained model.

For each setting, against the uncompressed cache ("auto", the model's fp32) in the same run:
- kv_rel_bf16: resident KV bytes while decoding (blocks held x bytes per block, scales included; staging rows
  for partial blocks excluded: they are O(sequences), not O(tokens)) over what bf16 blocks without eviction hold;
- kl, top1: KL(uncompressed || setting) of the next-token distributions and top-1 agreement, teacher-forced
  over the continuation of held-out stdlib files after a prefill (eviction happens at that prefill);
- bpb: bits per byte of that continuation (the tokenizer is byte-level);
- passkey: share of passkey examples (512-1024 tokens) whose 5 digits come out exactly (greedy);
- kv_rel_passkey: blocks in each passkey request's table right after its prompt (and eviction), summed, x bytes
  per block, over the same for auto in bf16: what eviction of a prompt saves (kv_rel_bf16 also counts the 64
  decoded tokens, which SnapKV keeps);
- decode_tok_s: median tokens per second over the decode steps of the held-out run (relative: `decode_rel`).

Run: `python benchmarks/kv_compression.py` (a few minutes on 2 CPU cores); `--quick` shrinks it for a smoke test,
`--model random` uses an untrained model of the same shape (only to test the script), `--model PATH` a checkpoint.

`--long`: the long-context table instead (`long_context`): 960-token prefills + 64 teacher-forced positions, and
streaming heads (DuoAttention) calibrated on other held-out texts and passkeys. Its byte columns are what the
cache reports in use (`PagedCache.kv_bytes_in_use`: live blocks x block-group bytes + live streaming slots x
streaming-group bytes, "auto" parts costed as bf16, staging rows excluded), maximum over the decode steps (text)
or over all steps (passkeys), over the same for "auto". Settings ending in "bs32" use 32-token blocks (the others
16): their staging rows (the one partially written block per sequence, full precision, excluded as above) are
twice as large. "log8": one-byte log scales (`kv_scale_format`); "K derot.": int4 keys in the block's RoPE frame
(`kv_key_derotate`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, print_table
from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.compression import calibrate_retrieval_heads, calibrate_streaming_heads, choose_streaming_heads
from hf_paged.cli.datasets import BYTE_BOS_TOKEN_ID, passkey_example, stdlib_documents

EVICTION = {"num_sink_tokens": 16, "window_tokens": 32}  # sinks + window: the question of a passkey prompt fits
SETTINGS: dict[str, dict] = {
    "auto": {},
    "fp8": {"kv_cache_dtype": "fp8"},
    "int8": {"kv_cache_dtype": "int8"},
    "int4": {"kv_cache_dtype": "int4"},
    "K8V4": {"key_cache_dtype": "int8", "value_cache_dtype": "int4"},
    "int4, V per head": {"kv_cache_dtype": "int4", "value_quant_group": "head"},
    "snapkv 0.5": {"kv_pruning": "snapkv", "kv_keep_ratio": 0.5, **EVICTION},
    "snapkv 0.25": {"kv_pruning": "snapkv", "kv_keep_ratio": 0.25, **EVICTION},
    "snapkv 0.2": {"kv_pruning": "snapkv", "kv_keep_ratio": 0.2, **EVICTION},
    "streaming 0.5": {"kv_pruning": "streaming", "kv_keep_ratio": 0.5, **EVICTION},
    "streaming 0.25": {"kv_pruning": "streaming", "kv_keep_ratio": 0.25, **EVICTION},
    "int8 + snapkv 0.25": {"kv_cache_dtype": "int8", "kv_pruning": "snapkv", "kv_keep_ratio": 0.25, **EVICTION},
    "K8V4 + snapkv 0.25": {"key_cache_dtype": "int8", "value_cache_dtype": "int4", "kv_pruning": "snapkv",
                           "kv_keep_ratio": 0.25, **EVICTION},
    "int4 + snapkv 0.4": {"kv_cache_dtype": "int4", "kv_pruning": "snapkv", "kv_keep_ratio": 0.4, **EVICTION},
    "int4 + snapkv 0.25": {"kv_cache_dtype": "int4", "kv_pruning": "snapkv", "kv_keep_ratio": 0.25, **EVICTION},
    "pyramidkv 0.5": {"kv_pruning": "pyramidkv", "kv_keep_ratio": 0.5, **EVICTION},
    "pyramidkv 0.25": {"kv_pruning": "pyramidkv", "kv_keep_ratio": 0.25, **EVICTION},
    # head-aware: the calibrated retrieval heads stay in full precision (filled in by main()), the others int4
    "int4, retrieval heads fp": {"kv_cache_dtype": "int4"},
    "int4, retrieval heads fp + snapkv 0.25": {"kv_cache_dtype": "int4", "kv_pruning": "snapkv",
                                               "kv_keep_ratio": 0.25, **EVICTION},
}
RETRIEVAL_FRACTION = 0.25  # share of (layer, KV head) pairs calibrated as retrieval heads
# Long-context table: `_streaming` = number of (layer, KV head) pairs made streaming, calibrated per window.
_STREAM = {"enable_prefix_caching": False, "num_sink_tokens": 16}
LONG_SETTINGS: dict[str, dict] = {
    "auto": {},
    "int8": {"kv_cache_dtype": "int8"},
    "int4": {"kv_cache_dtype": "int4"},
    "streaming 5/8, w128 (fp)": {"_streaming": 5, "window_tokens": 128, **_STREAM},
    "int4 + streaming 5/8, w128": {"kv_cache_dtype": "int4", "_streaming": 5, "window_tokens": 128, **_STREAM},
    "int4 + streaming 5/8, w64": {"kv_cache_dtype": "int4", "_streaming": 5, "window_tokens": 64, **_STREAM},
    "int4 + streaming 6/8, w128": {"kv_cache_dtype": "int4", "_streaming": 6, "window_tokens": 128, **_STREAM},
    "int8 + streaming 5/8, w64": {"kv_cache_dtype": "int8", "_streaming": 5, "window_tokens": 64, **_STREAM},
    # values quantized per (token, KV head) instead of per token (`value_quant_group="head"`)
    "int4, V per head": {"kv_cache_dtype": "int4", "value_quant_group": "head"},
    "int4 V/head + streaming 5/8, w64": {"kv_cache_dtype": "int4", "value_quant_group": "head", "_streaming": 5,
                                         "window_tokens": 64, **_STREAM},
    "int4 V/head + streaming 5/8, w128": {"kv_cache_dtype": "int4", "value_quant_group": "head", "_streaming": 5,
                                          "window_tokens": 128, **_STREAM},
    "int4 V/head + streaming 5/8, w96": {"kv_cache_dtype": "int4", "value_quant_group": "head", "_streaming": 5,
                                         "window_tokens": 96, **_STREAM},
    # 32-token blocks: KIVI's key group size, half the per-channel key scale bytes per token
    "int4 V/head, bs32": {"kv_cache_dtype": "int4", "value_quant_group": "head", "block_size": 32},
    "int4 V/head + streaming 5/8, w128, bs32": {"kv_cache_dtype": "int4", "value_quant_group": "head",
                                                "_streaming": 5, "window_tokens": 128, "block_size": 32, **_STREAM},
    "int4 V/head + streaming 5/8, w96, bs32": {"kv_cache_dtype": "int4", "value_quant_group": "head",
                                               "_streaming": 5, "window_tokens": 96, "block_size": 32, **_STREAM},
    # scales as one-byte log codes (`kv_scale_format="log8"`): int4 keys 0.625 B/elt, per-head int4 values 0.5625
    "int8, log8": {"kv_cache_dtype": "int8", "kv_scale_format": "log8"},
    "int4 V/head, log8": {"kv_cache_dtype": "int4", "value_quant_group": "head", "kv_scale_format": "log8"},
    "int4 V/head, log8, bs32": {"kv_cache_dtype": "int4", "value_quant_group": "head", "kv_scale_format": "log8",
                                "block_size": 32},
}
LONG_SETTINGS["int4 V/head, log8, K derotated"] = {**LONG_SETTINGS["int4 V/head, log8"], "kv_key_derotate": True}
for _window in (64, 96, 128):
    for _block in (16, 32):
        _name = f"int4 V/head log8 + streaming 5/8, w{_window}" + (", bs32" if _block == 32 else "")
        LONG_SETTINGS[_name] = {"kv_cache_dtype": "int4", "value_quant_group": "head", "kv_scale_format": "log8",
                                "_streaming": 5, "window_tokens": _window, "block_size": _block, **_STREAM}
        # int4 keys in the block's RoPE frame (`kv_key_derotate`, cache/key_frame.py)
        LONG_SETTINGS[_name.replace("log8", "log8 K derot.")] = {**LONG_SETTINGS[_name], "kv_key_derotate": True}


class ForceNext(LogitsProcessor):
    """Teacher forcing: the next token is the reference text's, whatever the model says (raw logits are kept)."""

    def __init__(self, reference: list[int]) -> None:
        self.reference = reference

    def __call__(self, input_ids, scores):
        target = self.reference[input_ids.shape[-1]]
        forced = torch.full_like(scores, float("-inf"))
        forced[:, target] = 0.0
        return forced


@dataclass(slots=True)
class Result:
    kv_rel_bf16: float
    kl: float
    top1: float
    bpb: float
    passkey: float
    decode_tok_s: float


def load_model(name: str):
    if name == "random":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=259, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048)
        return LlamaForCausalLM(config).eval()
    if name != "default":  # a checkpoint directory
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, local_files_only=True).eval()
    from hf_paged.api.models import default_model

    return default_model().model


def heldout_sequences(num: int, length: int) -> list[list[int]]:
    docs = [d for d in stdlib_documents("heldout") if len(d.text.encode("utf-8")) >= length]
    step = max(1, len(docs) // num)
    return [[BYTE_BOS_TOKEN_ID, *d.text.encode("utf-8")[: length - 1]] for d in docs[::step][:num]]


def run_engine(model, overrides: dict, requests: list[tuple[list[int], SamplingParams]]):
    """Run requests together; returns outputs, blocks held at the last all-decode step, decode tokens/s."""
    settings = {k: v for k, v in overrides.items() if not k.startswith("_")}
    engine = Engine(model, PagedConfig(**{"block_size": 16, "max_num_batched_tokens": 2048, **settings}))
    ids = [engine.add_request(p, s) for p, s in requests]
    held, rates, after_prefill, in_use = 0, [], {}, 0
    while engine.has_unfinished:
        decoding = all(r.num_computed_tokens >= len(r.prompt_ids) for r in engine.scheduler.running) and \
            engine.scheduler.running and not engine.scheduler.waiting
        start = time.perf_counter()
        step = engine.step()
        for r in engine.scheduler.running:  # blocks in each table right after its prompt (and any eviction)
            if r.request_id not in after_prefill and r.num_computed_tokens >= len(r.prompt_ids):
                after_prefill[r.request_id] = len(engine.kv.block_ids(r.request_id))
        if decoding or overrides.get("_in_use") == "all":
            in_use = max(in_use, engine.cache.kv_bytes_in_use(torch.bfloat16))
        if decoding:
            rates.append(sum(len(t) for t in step.new_tokens.values()) / (time.perf_counter() - start))
            held = max(held, engine.cache.pool.num_used_blocks)
    outs = [engine.pop_output(i) for i in ids]
    if overrides.get("_in_use"):  # what the cache reports in use, streaming slots included
        return outs, in_use, float(torch.tensor(rates).median()) if rates else 0.0
    bytes_per_block = _bytes_per_block(model, overrides)
    if overrides.get("_per_request"):
        held = sum(after_prefill.values())
    # Median over decode steps: the machine is shared, a mean would mostly measure the neighbours.
    return outs, held * bytes_per_block, float(torch.tensor(rates).median()) if rates else 0.0


def _bytes_per_block(model, overrides: dict, block_size: int = 16) -> int:
    """Bytes of one block over every layer, scales included, with "auto" costed as bf16 (the table's yardstick)."""
    from hf_paged import PagedCache

    settings = {k: v for k, v in overrides.items() if not k.startswith("_")}
    cfg = PagedConfig(**{"block_size": block_size, "num_blocks": 1, **settings})
    cache = PagedCache(model.config, cfg)
    if cache.compressed:
        return cache.compressed_bytes_per_block(torch.bfloat16)
    return cache.kv_shape.bytes_per_block(cfg.block_size, torch.bfloat16)


def quality(model, overrides: dict, sequences: list[list[int]], prefill: int):
    requests = []
    for seq in sequences:
        params = SamplingParams(max_new_tokens=len(seq) - prefill, output_logits=True,
                                logits_processors=[ForceNext(seq)])
        requests.append((seq[:prefill], params))
    outs, held_bytes, tok_s = run_engine(model, overrides, requests)
    logits = torch.cat([torch.stack(o.logits) for o in outs]).float()
    targets = torch.cat([torch.tensor(seq[prefill:]) for seq in sequences])
    return logits, targets, held_bytes, tok_s


def passkey(model, overrides: dict, examples) -> tuple[float, int]:
    """Accuracy, and the KV bytes the requests' tables hold right after their prompts (summed over requests)."""
    requests = [(ex.prompt_ids, SamplingParams(max_new_tokens=len(ex.answer))) for ex in examples]
    outs, held_bytes, _ = run_engine(model, {**overrides, "_per_request": True}, requests)
    right = sum(bytes(o.generated_tokens).decode("latin-1") == ex.answer for o, ex in zip(outs, examples))
    return right / len(examples), held_bytes


def calibration_samples(num_texts: int, num_passkeys: int, exclude: list[list[int]]) -> list[list[int]]:
    """Held-out texts that are not evaluated (1024 tokens) and passkey prompts with their answers (seeds 1000+)."""
    docs = [d for d in stdlib_documents("heldout") if len(d.text.encode("utf-8")) >= 1024]
    texts = [[BYTE_BOS_TOKEN_ID, *d.text.encode("utf-8")[:1023]] for d in docs]
    texts = [t for t in texts if t not in exclude]
    step = max(1, len(texts) // num_texts)
    samples = texts[step // 2 :: step][:num_texts]
    for seed in range(num_passkeys):
        ex = passkey_example(1000 + seed, 768)
        samples.append(ex.prompt_ids + list(ex.answer.encode("latin-1")))
    return samples


def long_context(model, args) -> None:
    """The long-context table (see the module docstring)."""
    num_texts, num_passkeys = (2, 4) if args.quick else (args.texts, args.passkeys)
    prefill, length = (448, 512) if args.quick else (960, 1024)
    sequences = heldout_sequences(num_texts, length)
    examples = [passkey_example(seed, 512 + (seed * 17) % 513) for seed in range(num_passkeys)]
    samples = calibration_samples(2 if args.quick else 4, 2 if args.quick else 4, sequences)
    names = args.settings or list(LONG_SETTINGS)
    chosen: dict[tuple[int, int, int], tuple] = {}
    # the per-pair KL depends on the window (and block size), not on how many pairs are chosen
    kl_by_window: dict[tuple[int, int], torch.Tensor] = {}
    for name in names:
        setting = LONG_SETTINGS[name]
        if "_streaming" in setting:
            key = (setting["_streaming"], setting["window_tokens"], setting.get("block_size", 16))
            if key[1:] not in kl_by_window:
                t0 = time.process_time()
                heads = calibrate_streaming_heads(model, samples, num_streaming=key[0], num_sink_tokens=16,
                                                  window=key[1], block_size=key[2])
                kl_by_window[key[1:]] = heads.kl
                print(f"window {key[1]}, block {key[2]}: KL per (layer, kv head) ({time.process_time() - t0:.0f} s "
                      f"CPU):\n{heads.kl}", file=sys.stderr, flush=True)
            chosen[key] = choose_streaming_heads(kl_by_window[key[1:]], key[0])
    quality(model, {}, sequences[:1], length - 4)  # warm-up
    rows, base = [], None
    for name in names:
        setting = dict(LONG_SETTINGS[name])
        if "_streaming" in setting:
            setting["kv_streaming_heads"] = chosen[setting.pop("_streaming"), setting["window_tokens"],
                                                   setting.get("block_size", 16)]
        t0 = time.perf_counter()
        logits, targets, held, tok_s = quality(model, {**setting, "_in_use": "decode"}, sequences, prefill)
        acc, pk_held, _ = run_passkeys(model, {**setting, "_in_use": "all"}, examples)
        if base is None:
            if name != "auto":
                raise ValueError("the long-context table needs 'auto' first (the reference)")
            base = (logits, held, tok_s, acc, pk_held)
        base_logp = F.log_softmax(base[0], -1)
        logp = F.log_softmax(logits, -1)
        kl = float((base_logp.exp() * (base_logp - logp)).sum(-1).mean())
        top1 = float((logits.argmax(-1) == base[0].argmax(-1)).float().mean())
        bpb = float(-logp.gather(1, targets[:, None]).mean() / math.log(2))
        rows.append([name, f"{held / base[1]:.3f}", f"{pk_held / base[4]:.3f}", f"{kl:.2e}", f"{top1:.4f}",
                     f"{bpb:.3f}", f"{acc:.2f}", f"{acc / max(base[3], 1e-9):.2f}", f"{tok_s:.0f}",
                     f"{tok_s / base[2]:.2f}"])
        print(f"  {name}: {time.perf_counter() - t0:.1f} s  {rows[-1]}", file=sys.stderr, flush=True)
    headers = ["setting", "kv_rel_bf16", "kv_rel_passkey", "kl", "top1", "bpb", "passkey", "passkey_rel",
               "decode_tok_s", "decode_rel"]
    title = (f"KV compression, long context, {args.model} model, {len(sequences)} held-out texts ({prefill} prefill "
             f"+ {length - prefill} scored), {len(examples)} passkeys (512-1024 tokens), block 16 (bs32: 32), sinks 16\n"
             f"{machine()}\nstreaming heads (layer: kv heads) by (pairs, window, block): {chosen}\n")
    table = print_table(headers, rows, title)
    if args.out:
        Path(args.out).write_text(table + "\n")


def run_passkeys(model, overrides: dict, examples) -> tuple[float, int, list]:
    requests = [(ex.prompt_ids, SamplingParams(max_new_tokens=len(ex.answer))) for ex in examples]
    outs, held, _ = run_engine(model, overrides, requests)
    right = [bytes(o.generated_tokens).decode("latin-1") == ex.answer for o, ex in zip(outs, examples)]
    return sum(right) / len(examples), held, right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default",
                        help="'default' (the embedded model), 'random' (untrained, same shape) or a checkpoint path")
    parser.add_argument("--quick", action="store_true", help="2 texts, 6 passkeys, 5 settings")
    parser.add_argument("--passkeys", type=int, default=20, help="passkey examples (512-1024 tokens)")
    parser.add_argument("--texts", type=int, default=4, help="held-out texts (448 prefill + 64 scored tokens)")
    parser.add_argument("--settings", nargs="*", default=None, help="names from the table (default: all)")
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--long", action="store_true", help="the long-context table (streaming heads)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = load_model(args.model)
    if args.long:
        return long_context(model, args)
    num_texts, num_passkeys, prefill, length = (2, 6, 320, 384) if args.quick else (args.texts, args.passkeys, 448, 512)
    sequences = heldout_sequences(num_texts, length)
    quality(model, {}, sequences[:1], length - 4)  # warm-up: first-call costs out of the measured runs
    examples = [passkey_example(seed, 512 + (seed * 17) % 513) for seed in range(num_passkeys)]
    names = args.settings or (["auto", "int8", "int4", "snapkv 0.25", "int4 + snapkv 0.25"] if args.quick
                              else list(SETTINGS))
    # Retrieval heads, calibrated on passkey prompts that are not among the evaluated ones.
    calibration = [passkey_example(1000 + seed, 640).prompt_ids for seed in range(4)]
    heads = calibrate_retrieval_heads(model, calibration, fraction=RETRIEVAL_FRACTION, window=64, num_sink_tokens=16)
    print(f"retrieval heads (layer: kv heads): {heads.full_precision_heads}; far-attention mass:\n{heads.scores}",
          file=sys.stderr)
    for name, setting in SETTINGS.items():
        if "retrieval heads fp" in name:
            setting["kv_full_precision_heads"] = heads.full_precision_heads
    base_logits, targets, base_bytes, base_tok_s = quality(model, {}, sequences, prefill)
    base_logp = F.log_softmax(base_logits, -1)
    base_passkey, base_pk_bytes = passkey(model, {}, examples)
    rows = []
    for name in names:
        t0 = time.perf_counter()
        if name == "auto":
            logits, held, tok_s, acc, pk_held = base_logits, base_bytes, base_tok_s, base_passkey, base_pk_bytes
        else:
            logits, _, held, tok_s = quality(model, SETTINGS[name], sequences, prefill)
            acc, pk_held = passkey(model, SETTINGS[name], examples)
        logp = F.log_softmax(logits, -1)
        kl = float((base_logp.exp() * (base_logp - logp)).sum(-1).mean())
        top1 = float((logits.argmax(-1) == base_logits.argmax(-1)).float().mean())
        bpb = float(-logp.gather(1, targets[:, None]).mean() / math.log(2))
        rel = held / base_bytes
        rows.append([name, f"{rel:.3f}", f"{pk_held / base_pk_bytes:.3f}", f"{kl:.2e}", f"{top1:.4f}", f"{bpb:.3f}", f"{acc:.2f}",
                     f"{acc / max(base_passkey, 1e-9):.2f}", f"{tok_s:.0f}", f"{tok_s / base_tok_s:.2f}"])
        print(f"  {name}: {time.perf_counter() - t0:.1f} s  {rows[-1]}", file=sys.stderr, flush=True)
    headers = ["setting", "kv_rel_bf16", "kv_rel_passkey", "kl", "top1", "bpb", "passkey", "passkey_rel", "decode_tok_s", "decode_rel"]
    title = (f"KV compression, {args.model} model, {len(sequences)} held-out texts ({prefill} prefill + "
             f"{length - prefill} scored), {len(examples)} passkeys (512-1024 tokens), block 16, sinks "
             f"{EVICTION['num_sink_tokens']}, window {EVICTION['window_tokens']}\n{machine()}\n")
    title += f"retrieval heads (fp in the 'retrieval heads fp' rows): {heads.full_precision_heads}\n"
    table = print_table(headers, rows, title)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
