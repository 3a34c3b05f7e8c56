"""`TextStream`: one choice's generated tokens in, its text out, as the client should see it.

Never splits a multi-byte character across chunks (a byte-level token may hold half of one), never shows a stop
sequence (OpenAI's output ends before it), and holds back a tail that may still turn into one.

Decoding is incremental: each push decodes a window that starts at the tokens of the push before (their text is
subtracted, so a SentencePiece window's dropped leading space, or a character that two pushes share, come out right),
not the whole output again (that was quadratic: 60 us a token at 500 tokens, 460 us at 4,000, on the server's event
loop). The text is the whole output's decode, as before: a window whose text does not extend its head's (a
byte-fallback run that a later byte makes invalid) takes the whole decode for that push, and a tokenizer that
rewrites across tokens (`clean_up_tokenization_spaces`) takes it at every push.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hf_paged.batching.stopping import settled

__all__ = ["CONTEXT_TOKENS", "TextStream", "decode_context"]

CONTEXT_TOKENS = 5  # prompt tokens the output is decoded after (vLLM's detokenizer starts 5 tokens back too)


class TextStream:
    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), context: Sequence[int] = (),
                 min_tokens: int = 0) -> None:
        """`context`: the prompt's last tokens (a few do: `CONTEXT_TOKENS`). The output is decoded after them and
        their text cut off, so a SentencePiece output's first "▁Paris" reads " Paris" (vLLM's detokenizer starts
        from the prompt's last tokens too), not "Paris": a decode of the output alone drops that leading space.
        `min_tokens`: no stop sequence ends within the text of the first `min_tokens` tokens (vLLM's min_tokens;
        the engine goes on past it, `stopping.check_stop`)."""
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.min_tokens = min_tokens
        self._num_output = 0  # output tokens pushed
        self._floor = 0  # characters of `text` no stop sequence may end within (the first min_tokens tokens')
        self.token_ids: list[int] = []  # the context's tokens, then the output's
        self.text = ""  # everything decoded so far (whole characters only)
        self.num_sent = 0  # characters of `text` handed out
        self.stopped = False  # a stop sequence was found: nothing more is shown
        self._incremental = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._done = ""  # the text of tokens [0, _read): whole characters, final
        self._start = 0  # the decode window's first token (the tokens of the push before `_read`)
        self._read = 0
        self._head = ""  # the decode of tokens [_start, _read)
        self._context, self._num_context = "", 0  # the context's text (before `text`, not in it), its tokens
        context, prefix = decode_context(tokenizer, context)
        if context:
            self.token_ids, self._context, self._num_context = context, prefix, len(context)
            self._commit(prefix)

    def push(self, token_ids: Sequence[int]) -> str:
        """New text to show after these tokens ("" while a character or a possible stop sequence is incomplete)."""
        if self.stopped or not token_ids:
            return ""
        within = self.min_tokens - self._num_output
        if 0 < within < len(token_ids):  # (a push of several tokens across the bound: its text there is the floor)
            return self.push(token_ids[:within]) + self.push(token_ids[within:])
        self.token_ids.extend(token_ids)
        self._num_output += len(token_ids)
        self.text = self._without_context(self._decoded(final=False), final=False)
        if self._num_output <= self.min_tokens:
            self._floor = len(self.text)
        return self._emit(final=False)

    def finish(self) -> str:
        """The rest of the text once the choice has ended."""
        if self.stopped:
            return ""
        self.text = self._without_context(self._decoded(final=True), final=True)  # a cut character stays cut
        return self._emit(final=True)

    def _without_context(self, text: str, final: bool) -> str:
        if text.startswith(self._context):
            return text[len(self._context) :]
        # (a decode that rewrote the context's text, a cleanup across the boundary: the output's own decode)
        text = self.tokenizer.decode(self.token_ids[self._num_context :], skip_special_tokens=True)
        return text if final else settled(text)

    def _decoded(self, final: bool) -> str:
        """The whole output's decode (its cut last character dropped unless `final`), from the window since the
        last commit point where the windows add up, else from the whole output."""
        ids = self.token_ids
        if self._incremental:
            window = self.tokenizer.decode(ids[self._start :], skip_special_tokens=True)
            if window.startswith(self._head):
                new = window[len(self._head) :]
                if final or not new.endswith("\ufffd"):  # (else a character may still be cut: wait for its bytes)
                    self._commit(self._done + new)
                    return self._done
                return self._done + settled(new)
        # the windows do not add up here (a byte-fallback run that later bytes make invalid, a rewrite across
        # tokens): the whole decode, and the windows go on from it
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if self._incremental and not text.endswith("\ufffd"):
            self._commit(text)
        return text if final else settled(text)

    def _commit(self, text: str) -> None:
        """`text` is final for every token so far; the next window starts at the tokens since the last commit."""
        self._done = text
        self._start, self._read = self._read, len(self.token_ids)
        self._head = self.tokenizer.decode(self.token_ids[self._start :], skip_special_tokens=True)

    def _emit(self, final: bool) -> str:
        text, end = self.text, len(self.text)
        if self.stop:
            longest = max(len(s) for s in self.stop)
            start = max(0, self.num_sent - longest + 1)
            hits = [i for i in (_find_past(text, s, start, self._floor) for s in self.stop) if i >= 0]
            if hits:
                end, self.stopped = min(hits), True
            elif not final:
                end -= _held_back(text, self.stop)
        end = max(end, self.num_sent)
        new, self.num_sent = text[self.num_sent : end], end
        return new


def _find_past(text: str, stop: str, start: int, floor: int) -> int:
    """The first occurrence of `stop` in `text` from `start` on that ends past `floor` characters (-1: none)."""
    return text.find(stop, max(start, floor - len(stop) + 1))


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that begins some stop sequence."""
    for k in range(min(len(text), max(len(s) for s in stops) - 1), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0


def decode_context(tokenizer: Any, prompt: Sequence[int]) -> tuple[list[int], str]:
    """The prompt's last `CONTEXT_TOKENS` tokens and their text, or none (([], "")) where that text ends inside a
    character (the output's first bytes may complete it)."""
    context = list(prompt)[-CONTEXT_TOKENS:]
    prefix = tokenizer.decode(context, skip_special_tokens=True) if context else ""
    return (context, prefix) if prefix and not prefix.endswith("\ufffd") else ([], "")
