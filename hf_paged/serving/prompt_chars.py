"""A prompt too long to fit, refused from its length in characters before the tokenizer reads it.

Tokenizing is the one cost a request pays before any check: 30 MB of text took this machine's tokenizer 107 s of a
worker thread, only to be told it has 30M tokens against 2,048 positions. Every token of a vocabulary covers at most
`longest` characters of its text, so a text of more than `max_len * longest` characters has more than `max_len`
tokens. `longest` is the vocabulary's longest token string (byte-level BPE writes one character per byte, SentencePiece
one per character, byte-fallback `<0x0A>` six for one), times `SLACK` for normalizers that compose characters
(NFC: "e" + U+0301 -> "é"), so the bound only refuses what cannot fit (a prompt of at most the bound is tokenized and
checked exactly, as before). The one exception: a normalizer that deletes characters (control characters) can
turn an over-long text into a short one; such a text is refused as too long, which is what its length says.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SLACK", "max_prompt_chars"]

SLACK = 4  # characters a normalizer may fold into one (combining marks), generously


def max_prompt_chars(tokenizer: Any, max_len: int) -> int | None:
    """The most characters a text of at most `max_len` tokens can have; None when the vocabulary cannot tell.
    Reads the whole vocabulary (~0.06 s for 50k tokens): call it once per tokenizer."""
    try:
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    except Exception:  # noqa: BLE001 -- a tokenizer without a string per id: no bound, the exact check stays
        return None
    lengths = [len(p) for p in pieces if isinstance(p, str)]
    if len(lengths) != len(pieces) or not lengths:  # a piece that is not a string (bytes, None): no bound
        return None
    return max_len * max(max(lengths), 1) * SLACK
