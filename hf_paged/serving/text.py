"""`TextStream`: one choice's generated tokens in, its text out, as the client should see it.

Never splits a multi-byte character across chunks (a byte-level token may hold half of one), never shows a stop
sequence (OpenAI's output ends before it), and holds back a tail that may still turn into one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TextStream"]


class TextStream:
    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.token_ids: list[int] = []
        self.text = ""  # everything decoded so far (whole characters only)
        self.num_sent = 0  # characters of `text` handed out
        self.stopped = False  # a stop sequence was found: nothing more is shown

    def push(self, token_ids: Sequence[int]) -> str:
        """New text to show after these tokens ("" while a character or a possible stop sequence is incomplete)."""
        if self.stopped or not token_ids:
            return ""
        self.token_ids.extend(token_ids)
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        self.text = text.rstrip("\ufffd")  # a character cut in half at the end: wait for its other bytes
        return self._emit(final=False)

    def finish(self) -> str:
        """The rest of the text once the choice has ended."""
        if self.stopped:
            return ""
        self.text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)  # a cut character stays cut
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        text, end = self.text, len(self.text)
        if self.stop:
            longest = max(len(s) for s in self.stop)
            start = max(0, self.num_sent - longest + 1)
            hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                end, self.stopped = min(hits), True
            elif not final:
                end -= _held_back(text, self.stop)
        end = max(end, self.num_sent)
        new, self.num_sent = text[self.num_sent : end], end
        return new


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that begins some stop sequence."""
    for k in range(min(len(text), max(len(s) for s in stops) - 1), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0
