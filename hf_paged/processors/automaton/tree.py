"""The regex tree our compiler reads (from `syntax.py` or `python_syntax.py`) and the NFA builder compiles.

    seq / alt / rep(lo, hi) / set(code point ranges) / look(start | end)
"""

from __future__ import annotations

from typing import NamedTuple

from hf_paged.processors.automaton.charsets import Ranges

__all__ = ["END", "START", "Node", "Unsupported"]

START, END = 0, 1  # the two anchors: start and end of the text


class Unsupported(Exception):
    """Syntax that Python's parser would read differently from Rust's (the caller falls back to outlines-core)."""


class Node(NamedTuple):
    """kind: "set" (one code point of `ranges`), "seq", "alt", "rep" (lo..hi copies, hi None: unbounded), "look"
    (`lo` is START or END). Immutable; a named tuple, not a frozen dataclass, because a parse makes one per
    character and a frozen dataclass's `__init__` costs ~3 us (a third of the fast reader's time)."""

    kind: str
    ranges: Ranges = ()
    children: tuple[Node, ...] = ()
    lo: int = 0
    hi: int | None = None
