"""Small tokenizers of the families users bring, built offline with the `tokenizers` library (no hub, no files):

| builder            | like                 | pieces                                                            |
|--------------------|----------------------|-------------------------------------------------------------------|
| `llama_like()`     | Llama 2, Mistral     | BPE with byte fallback (`<0xNN>` in the vocabulary), Metaspace    |
|                    |                      | pre-tokenizer and decoder (`▁` = space, a dummy prefix: `decode`  |
|                    |                      | drops the first token's leading space)                            |
| `qwen_like()`      | Qwen 2, Llama 3      | byte-level BPE, special `<|endoftext|>` `<|im_start|>` `<|im_end|>`, |
|                    |                      | added normal tokens `"  "`, `"\\n\\n"`, `<tool>`                      |
| `t5_like()`        | T5 (Unigram)         | Unigram over a fixed piece list, Metaspace, no byte fallback: no  |
|                    |                      | backslash, so a vocabulary that cannot spell every text           |

The BPE ones are trained (deterministically) on a small mixed corpus of JSON, Latin, CJK and emoji text; the
Unigram one is a hand-made piece list, so its ids never change.
"""

from __future__ import annotations

import json
import random
from functools import cache

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

WORDS = [
    "name",
    "age",
    "value",
    "true",
    "false",
    "null",
    "hello",
    "world",
    "café",
    "naïve",
    "中文",
    "数据",
    "😀",
    "🎉",
    "price",
    "12",
    "3.5",
    "-7",
    "1e10",
    "yes",
    "no",
    "red",
    "blue",
]


def corpus() -> list[str]:
    rng = random.Random(0)
    lines = []
    for _ in range(200):
        record = {rng.choice(WORDS): rng.choice([*WORDS, 1, 2.5, True, None]) for _ in range(rng.randint(1, 3))}
        lines.append(json.dumps(record, ensure_ascii=False))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(6)))
    lines.append("A line\n\n  indented")
    return lines


@cache
def llama_like() -> PreTrainedTokenizerFast:
    """SentencePiece-style BPE: `<unk> <s> </s>`, 256 `<0xNN>` byte pieces, then ~300 trained pieces."""
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=list('▁{}":,[]0123456789.-+eE'),
        limit_alphabet=60,
    )
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trained.train_from_iterator(corpus(), trainer)
    spec = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for piece, _ in sorted(spec["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@cache
def qwen_like() -> PreTrainedTokenizerFast:
    """Byte-level BPE (~300 trained tokens) with chat specials and added normal tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.add_tokens([AddedToken(text, special=False, normalized=False) for text in ("  ", "\n\n", "<tool>")])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


T5_PIECES = [
    "▁",
    *'{}":,[]=-.0123456789abcdefghijklmnopqrstuvwxyz',
    "é",
    "中",
    "文",
    "😀",
    "▁a",
    "▁b",
    "ab",
    "name",
    '{"',
    '":',
    '"}',
    "▁{",
    '▁"',
    "▁1",
    "12",
    "中文",
    "café",
    "no",
]


@cache
def t5_like() -> PreTrainedTokenizerFast:
    """Unigram over `T5_PIECES` (`<pad>` 0, `</s>` 1, `<unk>` 2): no byte fallback, no backslash."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(p, -float(len(p))) for p in T5_PIECES]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


FAMILIES = {"llama_like": llama_like, "qwen_like": qwen_like, "t5_like": t5_like}
