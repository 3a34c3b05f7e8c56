"""Log-probabilities in OpenAI's shapes: the engine's `TokenLogprobs` entries -> a choice's `logprobs` object.

    completions  {"tokens": [piece], "token_logprobs": [lp], "top_logprobs": [{piece: lp}], "text_offset": [int]}
                 (each top dict holds the top k and the chosen token, as vLLM's; echo's first prompt token: null;
                 a piece of a character is spelled "bytes:\\xe6\\x97", as OpenAI's API spells it)
    chat         {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}

`EntryStream` keeps one choice's entries in step with the text the client sees: an entry goes out with the chunk
whose text reaches its token, and when a stop sequence cuts the text, the tokens past the cut (those that only
spell the stop sequence) get no entry: the entries end where the text ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_paged.batching.logprobs import TokenLogprobs, TopLogprob
from hf_paged.batching.stopping import special_ids
from hf_paged.serving.text import decode_context

__all__ = ["EntryStream", "LogprobEntry", "TokenPieces", "chat_logprobs", "completion_logprobs", "token_start"]

_WINDOW = 8  # tokens before a new one that its text may change (the bytes of one character: 4 at most)


@dataclass(slots=True)
class LogprobEntry:
    """One token of a choice with its log-probability, as the client gets it."""

    token_id: int
    logprob: float | None  # None: echo's first prompt token (nothing before it)
    top: list[TopLogprob] | None  # the k most likely tokens at this position (None with logprob None)
    offset: int  # where the token's text starts in the choice's text (characters)


class TokenPieces:
    """Each token's text (the tokenizer's piece for that id) and bytes, memoised per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, bytes] | None = None
        self._special: frozenset[int] | None = None

    def text(self, token_id: int) -> str:
        piece = self._text.get(token_id)
        if piece is None:
            piece = self._text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return piece

    def bytes(self, token_id: int) -> list[int]:
        """The token's bytes (a byte-level piece that is half a character has its own bytes, not U+FFFD's)."""
        if self._bytes is None:
            try:
                from hf_paged.processors.index.vocabulary import token_bytes_map

                self._bytes = token_bytes_map(self.tokenizer)[0]
            except Exception:  # noqa: BLE001 -- a tokenizer the map cannot read: fall back to the decoded piece
                self._bytes = {}
        raw = self._bytes.get(token_id)
        return list(raw if raw is not None else self.text(token_id).encode("utf-8"))

    def chat_bytes(self, token_id: int) -> list[int] | None:
        """Chat's `bytes`: None for a special token (an EOS has no bytes in the text; OpenAI's null), so the
        entries' bytes joined are the content's."""
        if self._special is None:
            self._special = special_ids(self.tokenizer)  # (an added special token that all_special_ids misses too)
        return None if token_id in self._special else self.bytes(token_id)

    def label(self, token_id: int) -> str:
        """The token as a completions `tokens` item / `top_logprobs` key: its text, or, for bytes that are no whole
        UTF-8 text (a piece of a character), OpenAI's "bytes:\\xe6\\x97" spelling, so no two such tokens share a
        key and the text can be rebuilt from the tokens."""
        piece = self.text(token_id)
        if "\ufffd" not in piece:
            return piece
        raw = bytes(self.bytes(token_id))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class EntryStream:
    """One choice's entries, released as its text is shown (see the module docstring)."""

    def __init__(self, tokenizer: Any, context: Sequence[int] = ()) -> None:
        """`context`: the prompt's last tokens, as the choice's `TextStream` has them (offsets count from its text)."""
        self.tokenizer = tokenizer
        self.token_ids, prefix = decode_context(tokenizer, context)  # the context's tokens, then the output's
        self._num_context_chars = len(prefix)
        self.pending: list[LogprobEntry] = []  # entries not sent yet, in order

    def push(self, token_ids: Sequence[int], entries: Sequence[TokenLogprobs] | None,
             num_chars_before: int | None = None) -> None:
        """A delta's tokens and their entries (None: the request did not ask; nothing is kept). `num_chars_before`:
        the text's length before these tokens, when the caller has it (the choice's `TextStream` decoded it);
        the start of each later token of the delta is decoded here."""
        if not entries:
            self.token_ids.extend(token_ids)
            return
        for at, (token_id, entry) in enumerate(zip(token_ids, entries, strict=True)):
            start = self._start(token_id, num_chars_before if at == 0 else None)
            self.token_ids.append(token_id)
            self.pending.append(LogprobEntry(entry.token_id, entry.logprob, entry.top, start))

    def _start(self, token_id: int, num_chars_before: int | None) -> int:
        """Where `token_id`'s text starts, after the tokens so far: the text before it, less the characters that it
        changes or continues (a token of a cut character starts where that character does; an invalid byte that the
        token shows is final stays a U+FFFD of the text, so the token starts after it). `num_chars_before`: that text without its trailing
        U+FFFDs, as `TextStream.text` holds it. The tokens are read through a window of the last few (a character
        has at most 4 bytes), so a push costs the same at any output length."""
        decode = self.tokenizer.decode
        window = self.token_ids[-_WINDOW:]
        before = decode(window, skip_special_tokens=True)
        after = decode(window + [token_id], skip_special_tokens=True)
        cut = len(before.rstrip("\ufffd"))
        if num_chars_before is None or (cut == 0 and len(window) < len(self.token_ids)):  # (all U+FFFD: count all)
            whole = len(decode(self.token_ids, skip_special_tokens=True)) - self._num_context_chars
        else:
            whole = num_chars_before + len(before) - cut
        return whole - len(before) + token_start(before, after)

    def take(self, num_shown: int, *, final: bool = False, cut: bool = False) -> list[LogprobEntry]:
        """The entries whose token starts inside the first `num_shown` characters of text (`final` and not `cut`:
        all that are left, e.g. an EOS token, which shows no text)."""
        if final and not cut:
            out, self.pending = self.pending, []
            return out
        n = 0
        while n < len(self.pending) and self.pending[n].offset < num_shown:
            n += 1
        out, self.pending = self.pending[:n], self.pending[n:]
        if final:
            self.pending = []
        return out


def token_start(before: str, after: str) -> int:
    """Where a token starts in `before` (the text of what precedes it), `after` being the text with it: after the
    whole of `before` when it only adds characters (a U+FFFD of `before` that stays and gains a neighbour is an
    invalid byte, final); else at the first character it changes, or at the U+FFFD that still ends the text (the
    bytes of a character it continues: each token of a cut character starts where the character does)."""
    same = 0
    while same < min(len(before), len(after)) and before[same] == after[same]:
        same += 1
    if same == len(before) and len(after) > len(before):
        return same
    # a U+FFFD that ends the text with this token is the one character whose bytes may still be cut (the U+FFFDs
    # before it are bytes no later byte can complete)
    return min(same, len(after) - 1) if after.endswith("\ufffd") else same


def completion_logprobs(entries: Sequence[LogprobEntry], pieces: TokenPieces, offset: int = 0) -> dict:
    """The completions `logprobs` object; `offset` is added to every text offset (echo: the generated text's
    entries follow the prompt's)."""
    tops: list[dict[str, float] | None] = []
    for e in entries:
        if e.top is None:
            tops.append(None)
            continue
        top: dict[str, float] = {}
        for t in e.top:  # most likely first: a later token with the same label never replaces an earlier one
            top.setdefault(pieces.label(t.token_id), t.logprob)
        top.setdefault(pieces.label(e.token_id), e.logprob)  # the chosen token is always there (vLLM's shape)
        tops.append(top)
    return {
        "tokens": [pieces.label(e.token_id) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.offset + offset for e in entries],
    }


def chat_logprobs(entries: Sequence[LogprobEntry], pieces: TokenPieces) -> dict:
    """The chat `logprobs` object (`content`: one item per token, `top_logprobs`: exactly the top k)."""

    def item(token_id: int, logprob: float) -> dict:
        return {"token": pieces.text(token_id), "logprob": logprob, "bytes": pieces.chat_bytes(token_id)}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t.token_id, t.logprob)
                                                                          for t in e.top or []]}
                        for e in entries]}
