"""A waiting sequence's digests (hashed once, kept by sequence id) always belong to the prompt and extra keys asked
now: a sequence id reused with other tokens or another cache salt never gets the old prompt's digests (they would
name store blocks of another prefix)."""

from __future__ import annotations

from hf_paged.cache.digests import prefix_digests
from hf_paged.kv_transfer.request_digests import RequestDigests


def test_other_tokens_under_the_same_id_are_hashed_again():
    d = RequestDigests(4)
    first = list(range(1, 9))
    assert d.digests("s", first) == prefix_digests(first, 4, ())
    other = list(range(20, 28))
    assert d.digests("s", other) == prefix_digests(other, 4, ())
    grown = other + [40, 41, 42, 43, 44]  # the same prompt grown: only the new full block is hashed
    before = d.hashed_blocks
    assert d.digests("s", grown) == prefix_digests(grown, 4, ())
    assert d.hashed_blocks == before + 1


def test_another_salt_under_the_same_id_is_hashed_again():
    d = RequestDigests(4)
    tokens = list(range(1, 9))
    assert d.digests("s", tokens, ("a",)) == prefix_digests(tokens, 4, ("a",))
    assert d.digests("s", tokens, ("b",)) == prefix_digests(tokens, 4, ("b",))
    assert prefix_digests(tokens, 4, ("a",)) != prefix_digests(tokens, 4, ("b",))
