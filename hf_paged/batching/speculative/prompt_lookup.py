"""Prompt lookup: draft what followed the latest earlier occurrence of a request's last n tokens.

    tokens   ... a b c d e ... x y z | a b c          suffix "a b c" (n = 3) occurred before at 0..2
    draft    d e ...                                  what followed it, up to k tokens
A suffix with no earlier occurrence is retried one token shorter, down to n = 1 (the longest match wins); none:
no draft. When the match is recent (its continuation runs into the suffix itself, a loop), the draft repeats with
that period. Matching is against the request's own tokens only (prompt and output), which is what pays when the
output copies spans of the input (code edits, quoting, lists repeated with changes).
"""

from __future__ import annotations

from collections.abc import Sequence

from hf_paged.batching.request import Request
from hf_paged.batching.speculative.draft import Draft


class NgramIndex:
    """n-grams (n = 1 .. max_ngram) of one growing token sequence -> where their latest occurrence was followed.

    Invariant: for every n-gram ending before the last token, `_next[ngram]` is the position right after its
    latest occurrence; the n-grams ending at the last token are not indexed yet (they have no continuation)."""

    __slots__ = ("_next", "max_ngram", "num_indexed")

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.num_indexed = 0  # tokens seen by `extend`
        self._next: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Index the n-grams a longer `tokens` (the same sequence, grown at its end) adds."""
        table, max_ngram = self._next, self.max_ngram
        for p in range(max(self.num_indexed, 1), len(tokens)):  # p: the continuation of n-grams ending at p - 1
            for n in range(1, min(max_ngram, p) + 1):
                table[tuple(tokens[p - n : p])] = p
        self.num_indexed = len(tokens)

    def propose(self, tokens: Sequence[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` tokens following the latest earlier occurrence of the longest matching suffix."""
        self.extend(tokens)
        size = len(tokens)
        for n in range(min(self.max_ngram, size), 0, -1):
            p = self._next.get(tuple(tokens[size - n :]))
            if p is not None:
                period = size - p  # the suffix repeats tokens[p - n : p]: a loop of this period, at the shortest
                return [tokens[p + i % period] for i in range(num_tokens)]
        return []


class PromptLookupProposer:
    """`Proposer` by n-gram lookup (`NgramIndex`), one index per request, updated with the new tokens only."""

    def __init__(self) -> None:
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, requests: Sequence[Request], num_tokens: Sequence[int]) -> list[Draft]:
        drafts = []
        for request, k in zip(requests, num_tokens):
            tokens = request.all_token_ids
            index = self._indexes.get(request.request_id)
            max_ngram = request.params.prompt_lookup_max_ngram
            if index is None or index.max_ngram != max_ngram or index.num_indexed > len(tokens):
                index = self._indexes[request.request_id] = NgramIndex(max_ngram)
            drafts.append(Draft(index.propose(tokens, k)))
        return drafts

    def release(self, request_id: str) -> None:
        self._indexes.pop(request_id, None)

    def check_integrity(self, live_ids: set[str]) -> None:
        stale = set(self._indexes) - live_ids
        assert not stale, f"prompt lookup keeps indexes of ended requests {sorted(stale)[:5]}"
