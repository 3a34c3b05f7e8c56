"""A user's regex (Rust `regex` syntax, `hp.regex`) -> regex text over the JSON string bodies of the texts it matches.

A template hole between quotes holds a JSON string: the model writes the *encoded* body, the pattern constrains the
*decoded* text. The pattern is read the way every other user regex is read (Rust syntax: `automaton.syntax.parse`),
never as a JSON Schema `pattern` (ECMA-262 through Python's `re`, which reads `[a-z&&[^aeiou]]`, `[[:digit:]]` or
`[a-c--b]` as other classes and refuses `\\x{41}` and `(?U)`).

    pattern our reader reads      its tree, each set of code points written as JSON writes them (`pattern.emit`),
                                  anchors at the ends resolved (the whole body is matched)
    Rust-only syntax              (`\\p{..}`, class set operations, `(?i)`, `(?U)`, `\\b`, ...; outlines-core builds it)
                                  the pattern itself, when no text it matches holds a quote, a backslash or a control
                                  character (its body is its text); otherwise `UnsupportedSchemaError` naming it
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hf_paged.errors import UnsupportedSchemaError
from hf_paged.processors.automaton.byte_dfa import ByteDFA, anchored, build_byte_dfa
from hf_paged.processors.automaton.syntax import parse
from hf_paged.processors.automaton.tree import END, START, Node, Unsupported
from hf_paged.processors.schema.pattern import emit

__all__ = ["regex_string_body"]

_EMPTY = Node("seq")
_ESCAPED_BYTES = np.array([*range(0x20), 0x22, 0x5C])  # what JSON writes escaped: control characters, '"', '\'


@lru_cache(maxsize=256)
def regex_string_body(pattern: str) -> str:
    """Regex text matching the JSON string bodies (the text between the quotes) of the texts `pattern` matches in
    full. Sound: every body it matches decodes to a text the pattern matches (a character JSON escapes is written
    with its escape only where the pattern's class at that point holds nothing else, as in a schema's `pattern`).

    Raises:
        InvalidRegexError, UnsatisfiableSchemaError, SchemaTooComplexError: the pattern does not compile, matches
            nothing, or is over the default budget (`validate_regex`'s errors).
        UnsupportedSchemaError: Rust-only syntax in a pattern that may match a quote, a backslash or a control
            character, or an anchor inside the pattern; the message names the pattern and the fix.

    Memoised (a template's hole is written once per fill and per retry; errors are not kept).
    """
    try:
        tree = parse(pattern)
    except Unsupported:
        tree = None
    if tree is None:
        if _may_write(build_byte_dfa(anchored(pattern)), _ESCAPED_BYTES):
            raise UnsupportedSchemaError(
                f"the regex {pattern!r} between JSON quotes uses Rust-only syntax (Unicode classes, class set "
                "operations, flags such as (?i) or (?U), word boundaries) and may match a quote, a backslash or a "
                "control character, which the string body must escape: we cannot rewrite it; leave those "
                'characters out (e.g. [^"\\\\\\x00-\\x1f] instead of `.`), or put the hole outside the quotes'
            )
        return pattern  # (nothing it matches is escaped: the body is the text)
    tree = _drop_anchors(_drop_anchors(tree, START), END)
    if _has_anchor(tree):
        raise UnsupportedSchemaError(
            f"the regex {pattern!r} between JSON quotes has an anchor (^, $, \\A, \\z) inside it, which a string "
            "body cannot express; the whole value is matched already: remove the anchor"
        )
    body = emit(tree, None)
    assert body is not None  # (the pattern matches some text: `hp.regex` checked it)
    return body.text


def _drop_anchors(node: Node, side: int) -> Node:
    """`node` without the `side` anchors (START or END) at that edge, where they always hold in a whole match: an
    anchor there, or after (before) parts that match only the empty text."""
    if node.kind == "look":
        return _EMPTY if node.lo == side else node
    if node.kind == "alt":
        return node._replace(children=tuple(_drop_anchors(c, side) for c in node.children))
    if node.kind != "seq":
        return node
    kids = list(node.children)
    order = range(len(kids)) if side == START else range(len(kids) - 1, -1, -1)
    for i in order:
        empty_only = _empty_only(kids[i])
        kids[i] = _drop_anchors(kids[i], side)
        if not empty_only:
            break
    return node._replace(children=tuple(kids))


def _empty_only(node: Node) -> bool:
    """Whether `node` matches only the empty text (anchors, empty groups)."""
    if node.kind == "set":
        return False
    if node.kind == "rep":
        return node.hi == 0 or _empty_only(node.children[0])
    return all(_empty_only(c) for c in node.children)


def _has_anchor(node: Node) -> bool:
    return node.kind == "look" or any(_has_anchor(c) for c in node.children)


def _may_write(dfa: ByteDFA, escaped: np.ndarray) -> bool:
    """Whether some text the automaton matches holds one of the bytes `escaped`: an edge on one of them between two
    states on a path from the start to a final state."""
    transitions, dead = dfa.transitions, dfa.dead
    reached = np.zeros(dfa.num_states + 1, dtype=bool)
    reached[dfa.initial] = True
    while True:  # forward: the states some text leads to
        more = reached.copy()
        more[np.unique(transitions[reached])] = True
        more[dead] = False
        if (more == reached).all():
            break
        reached = more
    live = dfa.finals.copy()
    live[dead] = False
    while True:  # backward: the states from which some text ends in a final state
        more = live | live[transitions].any(axis=1)
        more[dead] = False
        if (more == live).all():
            break
        live = more
    useful = reached & live
    return bool(live[transitions[np.ix_(useful, escaped)]].any())
