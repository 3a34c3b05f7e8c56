"""What `echo: true` shows of a prompt: its text, where each of its tokens starts there, and which have no text.

A prompt sent as text is echoed as sent (OpenAI's and vLLM's echo; a client may cut its completion off with
`text[len(prompt):]`), not as its tokens decode: a BOS the tokenizer added would put "<|bos|>" before it. Such an
added token has an entry (its `tokens` piece, a null or scored log-probability) but no text: its offset is where the
next token starts. A prompt sent as token ids is echoed as its ids decode, special tokens included.

Offsets (`text_offset`) count characters of that text. A fast tokenizer's offset mapping gives them (each token's
start; an added token has an empty span); without one, the tokens' bytes are decoded in order and a token starts
after the characters completed before it (an invalid byte's U+FFFD among them), so the bytes of one character split
over several tokens all start at that character (as the generated tokens' offsets do, `logprobs.token_start`), never
past the end of the text.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any

from hf_paged.serving.logprobs import token_start

__all__ = ["PromptText", "prompt_text"]


@dataclass(frozen=True, slots=True)
class PromptText:
    text: str
    textless: frozenset[int] = field(default_factory=frozenset)  # positions of tokens with no text in `text`
    starts: tuple[int, ...] | None = None  # each token's first character in `text` (None: count the bytes)

    def offsets(self, ids: list[int], token_bytes: Any) -> list[int]:
        """Each token's `text_offset`: the mapping's starts, else the characters its bytes complete before it
        (`token_bytes(id)`: the token's bytes), the textless tokens adding none; clamped to the text's length."""
        if self.starts is not None and len(self.starts) == len(ids):
            return [min(start, len(self.text)) for start in self.starts]
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out, at = [], 0  # `at`: characters the decoder gave out (final); it holds back the bytes of a cut one
        for j, token in enumerate(ids):
            raw = b"" if j in self.textless else bytes(token_bytes(token))
            held = decoder.getstate()[0]
            start = token_start(held.decode("utf-8", "replace"), (held + raw).decode("utf-8", "replace"))
            out.append(min(at + start, len(self.text)))  # (held bytes that this token shows invalid come before it)
            at += len(decoder.decode(raw))
        return out


def prompt_text(tokenizer: Any, sent: str | list[int], ids: list[int]) -> PromptText:
    """The echo of one prompt as the client `sent` it (text or ids), tokenized as `ids`."""
    if not isinstance(sent, str):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        mapping = _offset_mapping(tokenizer, text, ids)  # the decoded text tokenizes back to the ids: its starts
        return PromptText(text, starts=None if mapping is None else _starts(mapping))
    mapping = _offset_mapping(tokenizer, sent, ids)
    if mapping is not None:
        return PromptText(sent, frozenset(j for j, (start, end) in enumerate(mapping) if start == end),
                          _starts(mapping))
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())  # no mapping: special ids are the added ones
    return PromptText(sent, frozenset(j for j, token in enumerate(ids) if token in special))


def _starts(mapping: list[tuple[int, int]]) -> tuple[int, ...]:
    """Token starts from an offset mapping, never decreasing (a tokenizer may overlap neighbouring spans)."""
    out, at = [], 0
    for start, _ in mapping:
        at = max(at, start)
        out.append(at)
    return tuple(out)


def _offset_mapping(tokenizer: Any, text: str, ids: list[int]) -> list[tuple[int, int]] | None:
    """Each token's (start, end) in `text` from a fast tokenizer, if it tokenizes `text` as `ids` (with or without
    its added special tokens); else None."""
    for add_special_tokens in (True, False):
        try:
            encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=add_special_tokens)
        except Exception:  # noqa: BLE001 -- a slow tokenizer has no offset mapping
            return None
        if list(encoded["input_ids"]) == list(ids):
            return list(encoded["offset_mapping"])
    return None
