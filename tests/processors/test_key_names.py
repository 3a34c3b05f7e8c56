"""The complement trie of an object's declared names (`schema.key_names.not_in`): written from sorted suffixes, a
name's own tail in one pass (`_tail`), it must equal the node-by-node walk of a dict trie, the form it replaced,
and match exactly the keys that are none of the names."""

from __future__ import annotations

import json
import random
import re

from hf_paged.processors.schema import key_names
from hf_paged.processors.schema.fragments import escape_text


def _trie_walk(node: dict) -> tuple[str | None, int, str | None, int]:
    """The reference: one call per trie node (the walk `_not_in_names` did before its tails were written at once)."""
    kids = sorted(c for c in node if c)
    others = key_names._key_chars_but(tuple(kids))
    leave, leave_cost = ([], 0) if others is None else ([others], 4)
    short: list[str] = [] if "" in node else [""]
    short_cost = 0
    for c in kids:
        if c >= " " and c != '"' and c != "\\":
            below_leave, below_leave_cost, below_short, below_short_cost = _trie_walk(node[c])
            char = c if c.isalnum() and c.isascii() else escape_text(c)
            if below_leave is not None:
                leave.append(char + below_leave)
                leave_cost += 1 + below_leave_cost
            if below_short is not None:
                short.append(char + below_short)
                short_cost += 1 + below_short_cost
    joined = []
    for parts, cost in ((leave, leave_cost), (short, short_cost)):
        if len(parts) > 1:
            joined += ["(?:" + "|".join(parts) + ")", cost + len(parts)]
        else:
            joined += [parts[0] if parts else None, cost]
    return tuple(joined)  # type: ignore[return-value]


def _trie(names: list[str]) -> dict:
    trie: dict = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}
    return trie


def test_every_node_below_the_root_equals_the_dict_trie_walk():
    rng = random.Random(3)
    alphabet = ["a", "b", "ab", "x", '"', "\\", "\x01", "é", "中", " ", "-", "$", ".", "\U0001f600", "\t"]
    for _ in range(2000):
        names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(1, 8))]
        names += names[:1] + [names[0][:-1]]  # (a duplicate, a prefix)
        for c, below in key_names._kids(tuple(sorted(set(names)))):
            trie = _trie(names)[c]
            assert key_names._node_text(below) == _trie_walk(trie), (names, c)


def test_the_complement_matches_exactly_the_keys_that_are_no_name():
    names = ["name", "names", "nam", "version", "v", "x-y", "é"]
    pattern = re.compile(key_names.not_in(names).text)
    for key in names:
        assert pattern.fullmatch(json.dumps(key, ensure_ascii=False)) is None
    for key in ["", "na", "namez", "namess", "ver", "versions", "w", "x-", "x-yz", "e", "a\\\"b"]:
        assert pattern.fullmatch(json.dumps(key, ensure_ascii=False)), key
