"""Tiny hand-made tokenizers for the processor tests (built with the `tokenizers` library, no files, no hub)."""

from __future__ import annotations

from functools import cache

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_paged.processors.index.vocabulary import bytes_to_unicode

# merges over GPT-2's byte-level alphabet (space is "Ġ"); chosen so JSON keys and punctuation get multi-byte tokens
BPE_MERGES = [
    ("{", '"'),
    ('"', ":"),
    ('"', ","),
    ("Ġ", '"'),
    ("n", "a"),
    ("m", "e"),
    ("na", "me"),
    ("a", "g"),
    ("ag", "e"),
    ("t", "r"),
    ("tr", "u"),
    ("tru", "e"),
    ("f", "a"),
    ("fa", "l"),
    ("fal", "s"),
    ("fals", "e"),
    ("1", "2"),
    ("Ġ", "Ġ"),
    ("}", "Ċ"),
]


def byte_level_bpe(merges=(), specials=("<eos>",)) -> Tokenizer:
    """A new GPT-2-style byte-level BPE `Tokenizer`: 256 byte tokens, one token per merge, then `specials`."""
    alphabet = list(bytes_to_unicode().values())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(name, special=True) for name in specials])
    return tok


@cache
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE: 256 byte tokens, a few merges, specials <eos> <pad> <|end|>, an added
    non-special token <tool>."""
    tok = byte_level_bpe(BPE_MERGES, ("<eos>", "<pad>", "<|end|>"))
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


@cache
def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-style SentencePiece BPE with byte fallback: `<0xNN>` byte tokens, `▁` for spaces, a few pieces."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    pieces = [
        "▁",
        "{",
        "}",
        '"',
        ":",
        ",",
        "a",
        "b",
        "e",
        "m",
        "n",
        "1",
        "2",
        "x",
        "é",
        "na",
        "me",
        "name",
        '{"',
        '":',
        "▁1",
        "▁{",
        '▁"',
    ]
    merges = [("n", "a"), ("m", "e"), ("na", "me"), ("{", '"'), ('"', ":"), ("▁", "1"), ("▁", "{"), ("▁", '"')]
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")  # keep ▁ attached
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(
        [AddedToken("<unk>", special=True), AddedToken("<s>", special=True), AddedToken("</s>", special=True)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="<s>", unk_token="<unk>")


def ids_of(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """Token ids of `text` without special tokens."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def accepts(proc, text: str, tokenizer: PreTrainedTokenizerFast | None = None) -> bool:
    """Whether `text`, in `tokenizer`'s tokens (the byte-level toy's by default), walks a processor's index (or the
    index itself) from its initial state to a final one."""
    index = getattr(getattr(proc, "compiled", None), "index", proc)
    state = index.get_initial_state()
    for token_id in ids_of(tokenizer or byte_level_tokenizer(), text):
        state = index.get_next_state(state, token_id)
        if state is None:
            return False
    return bool(index.is_final_state(state))
