"""Train hf_paged's embedded default model: a tiny byte-level Llama with GQA, on CPU, deterministically.

What it learns from (all offline, see `hf_paged.cli.datasets`), mixed per row of each batch:
- `--passkey-share` (45%) of rows start with a synthetic passkey example (`passkey_example`, 208 tokens to
  the row length), the key at a random depth (half of them right after the intro); the answer digits and the
  key's repeat inside its own line weigh `--answer-weight` (5x) in the loss. The question repeats the key
  line's prefix verbatim ("The pass key is #"), so copying answers it;
- `--repeat-share` (30%) of rows are copy drills: a random string of bytes 128-255, some stdlib text, the
  string again (every byte of the repeat is predictable only by copying);
- the rest of every row: random windows of the train split of this interpreter's standard-library sources
  (files split by a blake2b of their path), read as a stream of `[BOS] bytes [EOS]` documents.

The copy (induction) circuit that retrieval needs is written into the initial weights (`init_copy_circuit`)
because learnt from scratch it did not appear within this CPU budget; training refines it and learns the rest.

Settings (the defaults; each is a flag, e.g. `--steps 700`):
- model: LlamaConfig, hidden 256, 4 layers, 8 query heads / 2 KV heads (head_dim 32), MLP 512, RoPE theta
  1e7, max_position_embeddings 2048, tied embeddings, vocabulary 259 (256 bytes + BOS/EOS/PAD); 2.3M params.
- optimiser: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices only), peak lr 3e-3, linear warmup 50 steps,
  cosine decay to 10% of peak, gradient clipping at 1.0; 700 steps.
- batches: 2048 tokens a step; curriculum on the row length: 256 tokens for the first 35% of the steps,
  512 up to 65%, then 1024 (rows per step = 2048 / length). 1.4M tokens in all.
- determinism: one seed for torch, the copy-circuit codes and the data order (`random.Random`, string-seeded),
  `torch.use_deterministic_algorithms(True)`; the same flags on the same torch build give the same checkpoint
  (two 4-step runs gave byte-identical safetensors; the first 20 losses also matched between 1 and 2
  threads; 1 thread is the default and, on this shared machine, much the fastest).
- output: weights cast to float16 (safetensors, under 10 MB), the byte-level tokenizer (built with the
  `tokenizers` library: GPT-2 byte-to-unicode alphabet, no merges, so token id == byte value; `tokenizer(text)`
  prepends BOS), config and generation config with bos/eos/pad, and a README.md model card with the numbers.

Measured after training, on the float16 checkpoint loaded back in float32:
- bits per byte on 64 held-out stdlib windows of 512 bytes (model vs a unigram byte model of the train split);
- passkey accuracy (greedy digits, via one teacher-forced pass: the same as greedy decoding) on 50 held-out
  seeds at 512 and 1024 tokens, the key near the start.

Usage:
    nohup python scripts/train_tiny_lm.py > /tmp/train.log 2>&1 &    # ~15 min on one shared CPU core
    python scripts/train_tiny_lm.py --steps 40 --out /tmp/tiny-lm   # a smoke run elsewhere
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.cli.datasets import BYTE_BOS_TOKEN_ID, passkey_example, stdlib_documents

BOS, EOS, PAD = BYTE_BOS_TOKEN_ID, BYTE_BOS_TOKEN_ID + 1, BYTE_BOS_TOKEN_ID + 2
VOCAB_SIZE = 259
EVAL_PASSKEY_SEED = 1_000_000  # eval seeds start here; training seeds stay below
# Copy strings are drawn from bytes that (almost) never occur in the stdlib text around them, so each of
# their bytes has a single earlier match: the clearest signal for learning to copy.
_COPY_ALPHABET = bytes(range(128, 256))


@dataclass(slots=True)
class Settings:
    seed: int = 0
    threads: int = 1
    steps: int = 700
    tokens_per_step: int = 2048
    lengths: tuple[int, ...] = (256, 512, 1024)  # curriculum of row lengths ...
    length_until: tuple[float, ...] = (0.35, 0.65, 1.0)  # ... each used until this share of the steps
    passkey_share: float = 0.45
    repeat_share: float = 0.3
    answer_weight: float = 5.0
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    mlp: int = 512
    rope_theta: float = 1e7  # large: 8 of 16 RoPE pairs turn < 0.35 rad over 1024 tokens (see init_copy_circuit)
    lr: float = 3e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    circuit_init: bool = True
    eval_chunks: int = 64
    eval_chunk_bytes: int = 512
    eval_passkeys: int = 50


def build_tokenizer():  # -> PreTrainedTokenizerFast
    """Byte-level tokenizer, id == byte value; GPT-2's byte-to-unicode alphabet and no merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    # GPT-2's printable stand-ins for bytes, so the vocabulary file holds no control characters.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_in, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            stand_in[byte] = chr(byte)
        else:
            stand_in[byte] = chr(256 + extra)
            extra += 1
    vocab = {stand_in[b]: b for b in range(256)} | {"<|bos|>": BOS, "<|eos|>": EOS, "<|pad|>": PAD}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    # Like Llama's tokenizers, `tokenizer(text)` prepends BOS: the model saw BOS at the start of every document.
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", BOS)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|bos|>", "<|eos|>", "<|pad|>")])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>", model_max_length=2048
    )


def build_model(s: Settings):  # -> LlamaForCausalLM
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=s.hidden, intermediate_size=s.mlp, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, max_position_embeddings=2048,
        rope_theta=s.rope_theta, tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        initializer_range=0.02,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    if s.circuit_init:
        init_copy_circuit(model, seed=s.seed)
    return model


# Residual-stream dimensions that `init_copy_circuit` reserves (the others keep their random init).
_CONST_DIM = 0  # constant in every embedding: gives layer 0 a content-free query and key
_CODE_DIMS = slice(1, 17)  # a 16-dim code of the token (part of its embedding, read back by the tied head)
_PREV_DIMS = slice(192, 208)  # layer 0 writes the code of the previous token here ...
_PREV2_DIMS = slice(208, 224)  # ... and of the token before it here


@torch.no_grad()
def init_copy_circuit(model, *, seed: int, logit_scale: float = 10.0, match_scale: float = 14.0) -> None:
    """Start the model with a working copy ("induction") circuit; training then refines it and everything else.

    Why: retrieval is a copy. At "...The pass key is #" the model must find the earlier "#" and emit the byte
    after it, then the byte after that byte, and so on. Learnt from scratch this takes two heads that depend on
    each other (one moving each token's predecessor forward, one matching on it) and appears only after a long
    loss plateau: in several trials here no copying at all appeared within ~1M tokens (copy accuracy stayed
    at chance), about this whole CPU budget. So the circuit is written into the initial weights, in reserved dimensions:
    - embeddings: column 0 constant; columns 1-16 a random unit code of the token, scaled up; 192-223 zero.
    - layer 0, KV head 0 with query heads 0/1: content-free RoPE attention to the token 1 (resp. 2) back (the
      key is exp(j*theta_i) and the query exp(-j*(d-1)*theta_i) on the 4 fastest RoPE pairs, so the score is
      sum_i cos((t-s-d)*theta_i), largest at distance d); the value is the token code, written to 192-207
      (resp. 208-223). Query heads 2/3 start silent (zero output).
    - layer 1, KV head 0 with query head 0: query = the current token's code, key = the previous-token code,
      both on the 8 slowest RoPE pairs (with rope_theta 1e7 they turn by < 0.35 rad over 1024 tokens, so the
      match does not decay with distance); value = the attended token's code, written back to columns 1-16,
      where the tied output head reads it as "predict this byte". Query heads 1-3 start silent.
    The constant column adds the same logit to every token through the tied head, so it changes no prediction.
    """
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    half = head_dim // 2
    group = config.num_attention_heads // config.num_key_value_heads  # query heads per KV head
    theta = model.model.rotary_emb.inv_freq.float()
    code_size = _CODE_DIMS.stop - _CODE_DIMS.start
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randn(config.vocab_size, code_size, generator=generator)
    codes /= codes.norm(dim=1, keepdim=True)

    embed = model.model.embed_tokens.weight
    embed[:, _CONST_DIM] = 0.3
    embed[:, _CODE_DIMS] = 0.5 * codes
    embed[:, _PREV_DIMS.start : _PREV2_DIMS.stop] = 0.0
    rms = float(embed.pow(2).mean(dim=1).sqrt().mean())  # RMSNorm divides every embedding by about this
    eye = torch.eye(code_size)

    # Layer 0: previous-token heads.
    attn = model.model.layers[0].self_attn
    fast = theta[:4]
    w = math.sqrt(logit_scale * math.sqrt(head_dim)) / (0.3 / rms)  # one unit of cosine sum = logit_scale nats
    attn.k_proj.weight[:head_dim] = 0.0
    attn.k_proj.weight[: len(fast), _CONST_DIM] = torch.cos(fast) * w
    attn.k_proj.weight[half : half + len(fast), _CONST_DIM] = torch.sin(fast) * w
    attn.v_proj.weight[:head_dim] = 0.0
    attn.v_proj.weight[:code_size, _CODE_DIMS] = eye
    attn.q_proj.weight[: group * head_dim] = 0.0
    attn.o_proj.weight[:, : group * head_dim] = 0.0
    for head, (distance, dims) in enumerate(((1, _PREV_DIMS), (2, _PREV2_DIMS))):
        q = attn.q_proj.weight[head * head_dim : (head + 1) * head_dim]
        q[: len(fast), _CONST_DIM] = torch.cos(-(distance - 1) * fast) * w
        q[half : half + len(fast), _CONST_DIM] = torch.sin(-(distance - 1) * fast) * w
        attn.o_proj.weight[dims, head * head_dim : head * head_dim + code_size] = eye * rms  # same scale as code

    # Layer 1: the induction head, matching on the slow RoPE pairs (head dims 8-15 and 24-31).
    attn = model.model.layers[1].self_attn
    slow = [*range(half - code_size // 2, half), *range(head_dim - code_size // 2, head_dim)]
    rms1 = rms * math.sqrt(1.0 + 2 * 0.25 / (embed.pow(2).sum(dim=1).mean().item()))  # two codes were added
    code_in = 0.5 / rms1  # norm of a code after layer 1's RMSNorm
    w1 = math.sqrt(match_scale * math.sqrt(head_dim)) / code_in
    attn.q_proj.weight[: group * head_dim] = 0.0
    attn.k_proj.weight[:head_dim] = 0.0
    attn.v_proj.weight[:head_dim] = 0.0
    attn.o_proj.weight[:, : group * head_dim] = 0.0
    attn.q_proj.weight[slow, _CODE_DIMS] = eye * w1
    attn.k_proj.weight[slow, _PREV_DIMS] = eye * w1
    attn.v_proj.weight[:code_size, _CODE_DIMS] = eye
    attn.o_proj.weight[_CODE_DIMS, :code_size] = eye * (1.5 / code_in)  # the copied code, 3x the own code


def document_stream(docs) -> np.ndarray:
    """All documents as one uint16 array of `[BOS] bytes [EOS]` runs."""
    parts = []
    for doc in docs:
        parts.append(np.array([BOS], dtype=np.uint16))
        parts.append(np.frombuffer(doc.text.encode("utf-8"), dtype=np.uint8).astype(np.uint16))
        parts.append(np.array([EOS], dtype=np.uint16))
    return np.concatenate(parts)


@dataclass(slots=True)
class Batch:
    input_ids: torch.Tensor  # [rows, length]
    targets: torch.Tensor  # [rows, length], next token of each position (last one: -100)
    weights: torch.Tensor  # [rows, length] loss weight per position (answer digits weigh more)
    marks: torch.Tensor  # [rows, length] int8: 1 where the target is a pass key answer digit, 2 a copy target


class BatchSource:
    """Deterministic rows: random stream windows, a share of them led by a passkey example."""

    def __init__(self, stream: np.ndarray, s: Settings) -> None:
        self.stream, self.s = stream, s
        self.rng = random.Random(f"train-data/{s.seed}")

    def row(self, length: int) -> tuple[list[int], list[float], list[int]]:
        """Token ids (length + 1), loss weights and marks (1: pass key digit, 2: copy target) of one row."""
        ids: list[int] = []
        weights: list[float] = []
        marks: list[int] = []
        draw = self.rng.random()
        if draw < self.s.passkey_share and length >= 256:
            n = self.rng.randint(208, length - 8)
            depth = 0.0 if self.rng.random() < 0.5 else self.rng.random()
            ex = passkey_example(self.rng.randrange(EVAL_PASSKEY_SEED), n, depth=depth)
            ids = [*ex.prompt_ids, *(ex.answer + ".\n").encode("ascii"), EOS]
            weights, marks = [1.0] * len(ids), [0] * len(ids)
            # weights[i] scores the prediction of ids[i + 1]. Weighted: the key's repeat inside its own line
            # (a short-range copy, learnt first) and the answer after the question (the long-range copy).
            repeat = ex.prompt_text.index(f"it. {ex.answer}", ex.passkey_offset) + len("it. ") + 1
            for first, mark in ((repeat, 2), (n, 1)):
                for i in range(first - 1, first - 1 + len(ex.answer)):
                    weights[i], marks[i] = self.s.answer_weight, mark
        elif draw < self.s.passkey_share + self.s.repeat_share:
            # Units of: a random string, some stdlib text, the string again. Its first copy cannot be
            # predicted and its second only by copying, so these rows teach the copy (induction) mechanism
            # that retrieval needs; short units first make the copy distance a curriculum of its own.
            ids, weights, marks = [BOS], [1.0], [0]
            while len(ids) < length:
                m = self.rng.randint(4, min(32, length // 4))
                gap = self.rng.randint(0, min(128, length // 4))
                start = self.rng.randrange(len(self.stream) - gap)
                snippet = [self.rng.choice(_COPY_ALPHABET) for _ in range(m)]
                ids += [*snippet, *self.stream[start : start + gap].tolist()]
                weights += [1.0] * (m + gap)
                marks += [0] * (m + gap - 1) + [2]  # the last gap token predicts the repeat's first
                ids += snippet
                weights += [1.0] * m
                marks += [2] * (m - 1) + [0]
            ids, weights, marks = ids[: length + 1], weights[: length + 1], marks[: length + 1]
        rest = length + 1 - len(ids)
        if rest > 0:
            start = self.rng.randrange(len(self.stream) - rest)
            ids += self.stream[start : start + rest].tolist()
            weights += [1.0] * rest
            marks += [0] * rest
        return ids, weights, marks

    def batch(self, length: int) -> Batch:
        rows = [self.row(length) for _ in range(max(1, self.s.tokens_per_step // length))]
        full = torch.tensor([r[0] for r in rows], dtype=torch.long)
        return Batch(
            input_ids=full[:, :-1],
            targets=full[:, 1:],
            weights=torch.tensor([r[1][:length] for r in rows], dtype=torch.float32),
            marks=torch.tensor([r[2][:length] for r in rows], dtype=torch.int8),
        )


def length_at(s: Settings, step: int) -> int:
    for length, until in zip(s.lengths, s.length_until):
        if step < until * s.steps:
            return length
    return s.lengths[-1]


def lr_at(s: Settings, step: int) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, source: BatchSource, s: Settings) -> None:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s.lr, betas=(0.9, 0.95), eps=1e-8,
    )  # fmt: skip
    model.train()
    start, seen = time.time(), 0
    for step in range(s.steps):
        for group in optim.param_groups:
            group["lr"] = lr_at(s, step)
        batch = source.batch(length_at(s, step))
        logits = model(input_ids=batch.input_ids).logits
        losses = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), reduction="none")
        loss = (losses * batch.weights.flatten()).sum() / batch.weights.sum()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        seen += batch.input_ids.numel()
        if step % 20 == 0 or step == s.steps - 1:
            elapsed = time.time() - start
            # Share of this batch's pass key answer digits and copy targets the model gets right (argmax).
            right = logits.detach().argmax(-1) == batch.targets
            digits = right[batch.marks == 1].float().mean().item()
            copies = right[batch.marks == 2].float().mean().item()
            print(
                f"step {step:5d} len {batch.input_ids.shape[1]:4d} lr {lr_at(s, step):.2e} loss {loss.item():.4f} "
                f"bpb {losses.mean().item() / math.log(2):.3f} key {digits:.2f} copy {copies:.2f} "
                f"tok/s {seen / elapsed:.0f} elapsed {elapsed:.0f}s",
                flush=True,
            )


def eval_windows(docs, s: Settings) -> list[bytes]:
    """`eval_chunks` windows of `eval_chunk_bytes` bytes, each from the middle of a different held-out file."""
    long_docs = [d.text.encode("utf-8") for d in docs if len(d.text.encode("utf-8")) >= s.eval_chunk_bytes]
    stride = max(1, len(long_docs) // s.eval_chunks)
    windows = []
    for data in long_docs[::stride][: s.eval_chunks]:
        mid = (len(data) - s.eval_chunk_bytes) // 2
        windows.append(data[mid : mid + s.eval_chunk_bytes])
    return windows


@torch.no_grad()
def model_bits_per_byte(model, windows: list[bytes]) -> float:
    ids = torch.tensor([[BOS, *w] for w in windows], dtype=torch.long)
    logits = model(input_ids=ids[:, :-1]).logits.float()
    nll = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    return nll.item() / math.log(2) / ids[:, 1:].numel()


def unigram_bits_per_byte(train_stream: np.ndarray, windows: list[bytes]) -> float:
    """Cross-entropy of a byte unigram model (train-split counts, add-one smoothing) on the same windows."""
    counts = np.bincount(train_stream[train_stream < 256], minlength=256).astype(np.float64) + 1.0
    log_p = np.log2(counts / counts.sum())
    data = np.frombuffer(b"".join(windows), dtype=np.uint8)
    return float(-log_p[data].mean())


@torch.no_grad()
def passkey_accuracy(model, num_tokens: int, num_examples: int) -> float:
    """Share of held-out examples whose 5 digits greedy decoding gets right (via one teacher-forced pass)."""
    examples = [passkey_example(EVAL_PASSKEY_SEED + i, num_tokens) for i in range(num_examples)]
    ids = torch.tensor([[*e.prompt_ids, *e.answer.encode("ascii")] for e in examples], dtype=torch.long)
    hits = 0
    for row in ids.split(10):
        logits = model(input_ids=row[:, :-1]).logits
        predicted = logits[:, num_tokens - 1 :].argmax(-1)
        hits += int((predicted == row[:, num_tokens:]).all(dim=1).sum())
    return hits / num_examples


def model_card(s: Settings, num_params: int, metrics: dict[str, float], wall_s: float) -> str:
    return f"""# tiny-lm: hf_paged's embedded default model

A {num_params / 1e6:.2f}M-parameter Llama (GQA) with a byte-level vocabulary, trained from scratch on CPU by
`scripts/train_tiny_lm.py` on the Python standard library's sources (train split by file), synthetic passkey
examples and copy drills. It exists so that tests and benchmarks have a real trained model, with real
long-range attention, offline; it is not a useful language model. Load it with `hf_paged.default_model()` or
`AutoModelForCausalLM.from_pretrained(path)` / `AutoTokenizer.from_pretrained(path)`.

## Architecture
LlamaForCausalLM: hidden {s.hidden}, {s.layers} layers, {s.heads} query heads, {s.kv_heads} KV heads
(head_dim {s.hidden // s.heads}), MLP {s.mlp}, RoPE theta {s.rope_theta:g}, max_position_embeddings 2048, tied
embeddings. Vocabulary 259: ids 0-255 are the bytes, 256 `<|bos|>`, 257 `<|eos|>` (also the generation
config's EOS), 258 `<|pad|>`. The tokenizer prepends BOS. Weights are stored in float16.

## How it retrieves
Its copy (induction) circuit was written into the initial weights (`init_copy_circuit` in the training
script: layer 0 heads that move the previous two tokens' codes forward, a layer 1 head that matches the
current token against them on slow RoPE dimensions and copies the next token) and then trained together with
everything else. Layer 0's KV head 0 and layer 1's KV head 0 are therefore the retrieval heads; compressing or
evicting their KV is what hurts passkey accuracy first.

## Training settings
```json
{json.dumps(asdict(s), indent=1)}
```
Wall time {wall_s / 60:.1f} min on {s.threads} shared CPU thread(s), torch {torch.__version__}, Python
{sys.version.split()[0]} (its stdlib is the corpus).

## Measured (float16 checkpoint loaded in float32)
| metric | value |
|---|---|
| held-out bits per byte, this model | {metrics["bpb_model"]:.3f} |
| held-out bits per byte, unigram byte baseline (train-split counts) | {metrics["bpb_unigram"]:.3f} |
| passkey accuracy, 512 tokens ({s.eval_passkeys} held-out seeds, key near the start) | {metrics["passkey_512"]:.2f} |
| passkey accuracy, 1024 tokens ({s.eval_passkeys} held-out seeds, key near the start) | {metrics["passkey_1024"]:.2f} |

Held-out text: {s.eval_chunks} windows of {s.eval_chunk_bytes} bytes from the middle of held-out stdlib files,
each scored after a BOS. Passkey: `hf_paged.cli.datasets.passkey_example(1_000_000 + i, n)` for i < {s.eval_passkeys},
correct when greedy decoding gives all 5 digits.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Settings()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, tuple):
            parser.add_argument(flag, type=type(value[0]), nargs="+", default=list(value))
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_PATH)
    args = parser.parse_args(argv)
    s = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items() if k != "out"})

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    train_stream = document_stream(stdlib_documents("train"))
    windows = eval_windows(stdlib_documents("heldout"), s)
    print(f"train stream {len(train_stream):,} tokens; {len(windows)} held-out windows; {s}", flush=True)

    model = build_model(s)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params:,} parameters", flush=True)
    train(model, BatchSource(train_stream, s), s)
    wall_s = time.time() - t0

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16)
    model.generation_config.update(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, do_sample=False)
    model.save_pretrained(args.out)
    build_tokenizer().save_pretrained(args.out)

    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32).eval()
    metrics = {
        "bpb_model": model_bits_per_byte(reloaded, windows),
        "bpb_unigram": unigram_bits_per_byte(train_stream, windows),
        "passkey_512": passkey_accuracy(reloaded, 512, s.eval_passkeys),
        "passkey_1024": passkey_accuracy(reloaded, 1024, s.eval_passkeys),
    }
    print("metrics", json.dumps(metrics), flush=True)
    (args.out / "README.md").write_text(model_card(s, num_params, metrics, wall_s))
    print(f"saved to {args.out} in {(time.time() - t0) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
