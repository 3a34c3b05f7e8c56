"""What `echo: true` shows of a prompt: its text, and which of its tokens have no text there.

A prompt sent as text is echoed as sent (OpenAI's and vLLM's echo; a client may cut its completion off with
`text[len(prompt):]`), not as its tokens decode: a BOS the tokenizer added would put "<|bos|>" before it. Such an
added token has an entry (its `tokens` piece, a null or scored log-probability) but no text: its offset is where the
next token starts (`echo.prompt_entries` counts the pieces' running lengths, skipping these). A fast tokenizer's
offset mapping names them (an empty span); without one, the tokenizer's special ids are taken as added. A prompt
sent as token ids is echoed as its ids decode, special tokens included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PromptText", "prompt_text"]


@dataclass(frozen=True, slots=True)
class PromptText:
    text: str
    textless: frozenset[int] = field(default_factory=frozenset)  # positions of tokens with no text in `text`


def prompt_text(tokenizer: Any, sent: str | list[int], ids: list[int]) -> PromptText:
    """The echo of one prompt as the client `sent` it (text or ids), tokenized as `ids`."""
    if not isinstance(sent, str):
        return PromptText(tokenizer.decode(ids, skip_special_tokens=False))
    mapping = _offset_mapping(tokenizer, sent, ids)
    if mapping is not None:
        return PromptText(sent, frozenset(j for j, (start, end) in enumerate(mapping) if start == end))
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())  # no mapping: special ids are the added ones
    return PromptText(sent, frozenset(j for j, token in enumerate(ids) if token in special))


def _offset_mapping(tokenizer: Any, text: str, ids: list[int]) -> list[tuple[int, int]] | None:
    """Each token's (start, end) in `text` from a fast tokenizer, if it tokenizes `text` as `ids`; else None."""
    try:
        encoded = tokenizer(text, return_offsets_mapping=True)
    except Exception:  # noqa: BLE001 -- a slow tokenizer has no offset mapping
        return None
    return list(encoded["offset_mapping"]) if list(encoded["input_ids"]) == list(ids) else None
