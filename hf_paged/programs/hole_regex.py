"""A user's regex inside a larger one: a `gen`'s pattern in a group, a template hole's pattern between forced
literals. What compiles on its own (`RegexLogitsProcessor(pattern)`) compiles here too, and an error quotes the
user's pattern, not our composition.

    group(p)                   "(?:" + p + ")"; closed on a new line when p may end in a verbose-mode comment
    check_composed(what, ...)  the composed regex compiles and matches something, or a typed error in p's terms

Why the new line: in verbose mode (`(?x)`) a `#` starts a comment that runs to the end of the line, so in
`(?:(?x) a b # c)` the closing `)` is comment text. `(?x)\\n` before the closing ends any such comment and is
nothing otherwise: inside a comment the flag group is comment text and the new line ends the comment; outside one
it turns verbose mode on for the rest of our group only (Rust scopes flags to their group), which skips the new
line. (The processor anchors a pattern the same way, `automaton/byte_dfa.py`.)
"""

from __future__ import annotations

import re

from hf_paged.errors import InvalidRegexError, UnsatisfiableSchemaError

__all__ = ["check_composed", "group"]

_VERBOSE_FLAG = re.compile(r"\(\?[A-Za-z]*x")  # (?x), (?ix), (?x:...): a `#` may start a comment


def group(pattern: str) -> str:
    """`pattern` as one group, whatever it ends with (see the module docstring)."""
    comment_safe = "#" in pattern and _VERBOSE_FLAG.search(pattern) is not None
    return "(?:" + pattern + ("(?x)\n" if comment_safe else "") + ")"


def check_composed(what: str, pattern: str, composed: str, literal: str) -> None:
    """Compile `composed` (the byte automaton, memoised for the processor built next); when it fails, raise the same
    error class in the terms of `pattern` (the user's, which compiled alone) and `literal` (forced after it)."""
    from hf_paged.processors.automaton.build import validate_regex

    try:
        validate_regex(composed)
    except (InvalidRegexError, UnsatisfiableSchemaError) as exc:
        after = f"followed by the template's literal {literal!r}" if literal else "inside the field's constraint"
        problem = "matches no text" if isinstance(exc, UnsatisfiableSchemaError) else "does not compile"
        raise type(exc)(
            f"{what}: the regex {pattern!r} compiles on its own but {problem} {after}: an anchor, a word boundary "
            "or a multi-line `$` at its end can hold nowhere there (the cause below has the compiler's reason on "
            "the composed regex); change the pattern or the text after the hole") from exc
