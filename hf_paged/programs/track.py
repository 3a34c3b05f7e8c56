"""A program state's text and tokens (`Track`), and what each call left behind (`CallRecord`, `Attempt`,
`TokenCounts`): plain values, no engine.

A track is the token ids computed so far plus text appended but not yet tokenized:

    ids: [ prompt tokens | generated tokens | ... ]   pending: "text appended since the last call"
    text = decode-free concatenation of everything appended (literal text and field values, exactly)

Text between two model calls is tokenized at once when the next call needs it (its first run with the tokenizer's
special tokens, e.g. BOS); generated tokens are kept as the model produced them, so each call's prompt extends the
previous call's tokens and its blocks come from the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Attempt", "CallRecord", "TokenCounts", "Track"]


@dataclass(slots=True)
class TokenCounts:
    """Tokens of one call (or a sum of calls).

    `prefilled`: prompt tokens computed; `cached`: prompt tokens served from the prefix cache; `generated`: tokens
    the requests produced (sampled or forced); `forced`: of those, tokens wholly inside forced literal text (a
    template's literals produced by jump-forward); `requests`: engine requests run."""

    prefilled: int = 0
    cached: int = 0
    generated: int = 0
    forced: int = 0
    requests: int = 0

    def add(self, other: TokenCounts) -> None:
        self.prefilled += other.prefilled
        self.cached += other.cached
        self.generated += other.generated
        self.forced += other.forced
        self.requests += other.requests

    @property
    def prompt(self) -> int:
        return self.prefilled + self.cached

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens served from the prefix cache."""
        return self.cached / self.prompt if self.prompt else 0.0


@dataclass(frozen=True, slots=True)
class Attempt:
    """One generation of a field: its value, why it ended, whether the validator took it, its seed."""

    value: str
    finish_reason: str
    valid: bool
    seed: int | None


@dataclass(slots=True)
class CallRecord:
    """What a `gen` or `select` produced: the value, why it ended ("stop", "length", "scored"), every attempt (the
    last is the value kept), whether the value passed its validator, the tokens, and for a select each choice's
    score."""

    name: str
    kind: str  # "gen" | "select"
    value: str
    finish_reason: str
    attempts: list[Attempt] = field(default_factory=list)
    valid: bool = True
    tokens: TokenCounts = field(default_factory=TokenCounts)
    scores: dict[str, float] | None = None  # select: choice -> score (summed or mean log-probability)


@dataclass(slots=True)
class Track:
    """Token ids computed so far, text not yet tokenized, the full text, the fields and the call records."""

    ids: list[int] = field(default_factory=list)
    pending: str = ""
    text: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)
    pinned: list[int] | None = None  # the prefix this track holds pinned in the prefix cache (its full blocks)

    def append_text(self, text: str) -> None:
        self.pending += text
        self.text += text

    def append_tokens(self, ids: list[int], text: str) -> None:
        """Tokens whose text is `text`, after everything so far (pending text first, so order is kept)."""
        if self.pending:
            raise AssertionError("flush pending text before appending tokens")
        self.ids.extend(ids)
        self.text += text

    def copy(self) -> Track:
        """A fork: the same tokens, text and fields (the prefix blocks stay shared through the cache); its own
        records and pin."""
        return Track(list(self.ids), self.pending, self.text, dict(self.fields), [], None)

    def totals(self) -> TokenCounts:
        total = TokenCounts()
        for record in self.calls:
            total.add(record.tokens)
        return total
