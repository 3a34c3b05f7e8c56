"""A user's regex inside a larger one: a `gen`'s pattern in a group, a template hole's pattern between forced
literals. What compiles on its own (`RegexLogitsProcessor(pattern)`) compiles here too, and an error quotes the
user's pattern, not our composition.

    group(p)                   "(?:" + p + ")"; closed on a new line when p may end in a verbose-mode comment
    strip_end_anchors(p)       p without the anchors at its ends: ^ \\A leading, $ \\z closing a top-level
                               alternative (a field's value is matched whole, so they hold there anyway)
    inner_anchors(p)           the anchors left inside p (in a group, under a quantifier): in a template they
                               would hold only at the ends of the whole generation, so `parse_template` refuses them
    check_composed(what, ...)  the composed regex compiles and matches something, or a typed error in p's terms
    rust_only_classes(p)       p's classes that Python's `re` reads otherwise (nested, `&&` `--` `~~`): where a
                               Python reading stands in for Rust's (a JSON string hole, splitting values), it is off

Why the new line: in verbose mode (`(?x)`) a `#` starts a comment that runs to the end of the line, so in
`(?:(?x) a b # c)` the closing `)` is comment text. `(?x)\\n` before the closing ends any such comment and is
nothing otherwise: inside a comment the flag group is comment text and the new line ends the comment; outside one
it turns verbose mode on for the rest of our group only (Rust scopes flags to their group), which skips the new
line. (The processor anchors a pattern the same way, `automaton/byte_dfa.py`.)
"""

from __future__ import annotations

import re

from hf_paged.errors import InvalidRegexError, UnsatisfiableSchemaError
from hf_paged.processors.automaton.python_syntax import rust_only

__all__ = ["check_composed", "group", "inner_anchors", "python_regex", "rust_only_classes", "strip_end_anchors"]

_VERBOSE_FLAG = re.compile(r"\(\?[A-Za-z]*x")  # (?x), (?ix), (?x:...): a `#` may start a comment
_FLAG_GROUP = re.compile(r"\(\?([A-Za-z]*)(?:-([A-Za-z]*))?([:)])")  # (?flags) or (?flags:
_GROUP_OPEN = re.compile(r"\((?:\?P?<[A-Za-z0-9_]*>)?")  # (, (?P<name>, (?<name>
_REPEAT = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")


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


# -- anchors -------------------------------------------------------------------------------------------------
# A small reader of Rust regex syntax, enough to tell an anchor from a literal: escapes (with their braces),
# classes (nested, a leading `]` literal), groups and the flags they scope (`x`: white space and `#` comments are
# nothing; `m`: `^` and `$` are line anchors, which look at the text on both sides and so mean the same in a
# hole), alternatives and repetitions. Tokens: (kind, start, end, depth); kinds: "start" (^ \A), "end" ($ \z),
# "line" (^ $ under `m`), "flags", "open", "close", "bar", "repeat", "atom".


def strip_end_anchors(pattern: str) -> str:
    """`pattern` without a leading `^`/`\\A` and a closing `$`/`\\z` of each top-level alternative (after or before
    flag groups only; an anchor under a repetition stays)."""
    tokens = _tokens(pattern)
    drop: list[tuple[int, int]] = []
    branch: list[tuple[str, int, int, int]] = []
    for token in [*tokens, ("bar", len(pattern), len(pattern), 0)]:
        if token[0] != "bar" or token[3] != 0:
            branch.append(token)
            continue
        significant = [t for t in branch if t[0] != "flags"]
        if significant and significant[0][0] in ("start", "line"):
            nxt = branch[branch.index(significant[0]) + 1:]
            if not (nxt and nxt[0][0] == "repeat"):
                drop.append(significant[0][1:3])
                significant = significant[1:]
        if significant and significant[-1][0] in ("end", "line") and pattern[significant[-1][1]] != "^":
            drop.append(significant[-1][1:3])
        branch = []
    for start, end in sorted(drop, reverse=True):
        pattern = pattern[:start] + pattern[end:]
    return pattern


def inner_anchors(pattern: str) -> list[tuple[str, int]]:
    """The text-boundary anchors of `pattern` (`^ $ \\A \\z`, not multi-line ones) with their positions."""
    return [(pattern[t[1]:t[2]], t[1]) for t in _tokens(pattern) if t[0] in ("start", "end")]


def python_regex(pattern: str | None) -> re.Pattern | None:
    """Python's reading of a Rust pattern (DOTALL: `.` spans lines, as the composed regexes say where they mean
    otherwise), or None where it cannot read it (Rust-only syntax) or would read it otherwise (`rust_only_classes`)."""
    if pattern is None or rust_only_classes(pattern) or rust_only(pattern) is not None:
        return None
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error:
        return None


def rust_only_classes(pattern: str) -> list[str]:
    """The classes of `pattern` that Rust and Python's `re` read differently: a nested class (`[a-z&&[^aeiou]]`,
    `[[:alpha:]]`) or a set operation (`&&`, `--`, `~~`), which Python takes as literal characters."""
    found = []
    for _, start, end, _ in _tokens(pattern):
        if pattern[start] != "[":
            continue
        body = pattern[start + 1 : end - 1]
        j = 1 if body.startswith("^") else 0
        j += 1 if body.startswith("]", j) else 0
        while j < len(body):
            if body[j] == "\\":
                j += 2
                continue
            if body[j] == "[" or body[j : j + 2] in ("&&", "--", "~~"):
                found.append(pattern[start:end])
                break
            j += 1
    return found


def _tokens(pattern: str) -> list[tuple[str, int, int, int]]:
    tokens: list[tuple[str, int, int, int]] = []
    saved: list[tuple[bool, bool]] = []  # the flags outside each open group
    verbose = multi_line = False
    i, n = 0, len(pattern)
    while i < n:
        char, depth = pattern[i], len(saved)
        if verbose and char in " \t\n\r\f\v":
            i += 1
            continue
        if verbose and char == "#":  # a comment, to the end of the line
            end = pattern.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        kind, end = "atom", i + 1
        if char == "\\":
            end = min(n, i + 2)
            if end < n and pattern[i + 1] in "pPxub" and pattern[end] == "{":  # \p{..}, \x{..}, \b{start}
                close = pattern.find("}", end)
                end = n if close < 0 else close + 1
            kind = {"A": "start", "z": "end"}.get(pattern[i + 1:end], "atom")
        elif char == "[":
            end = _class_end(pattern, i)
        elif char == "(":
            flags = _FLAG_GROUP.match(pattern, i)
            on, off, close = flags.groups("") if flags is not None else ("", "", ":")
            if flags is not None and close == ")":
                kind, end = "flags", flags.end()
            else:
                kind, end = "open", flags.end() if flags is not None else _GROUP_OPEN.match(pattern, i).end()
                saved.append((verbose, multi_line))
            verbose = ("x" in on or verbose) and "x" not in off
            multi_line = ("m" in on or multi_line) and "m" not in off
        elif char == ")":
            kind = "close"
            if saved:
                verbose, multi_line = saved.pop()
                depth = len(saved)
        elif char == "|":
            kind = "bar"
        elif char in "*+?":
            kind, end = "repeat", i + 2 if pattern.startswith("?", i + 1) else i + 1
        elif char == "{" and _REPEAT.match(pattern, i):
            match = _REPEAT.match(pattern, i)
            kind, end = "repeat", match.end() + (1 if pattern.startswith("?", match.end()) else 0)
        elif char in "^$":
            kind = "line" if multi_line else "start" if char == "^" else "end"
        tokens.append((kind, i, end, depth))
        i = end
    return tokens


def _class_end(pattern: str, i: int) -> int:
    """Where the class opened at `i` ends (Rust: a `[` inside opens a nested class; a leading `]` is literal)."""
    j, n = i + 1, len(pattern)
    if j < n and pattern[j] == "^":
        j += 1
    if j < n and pattern[j] == "]":
        j += 1
    while j < n:
        if pattern[j] == "\\":
            j += 2
        elif pattern[j] == "[":
            j = _class_end(pattern, j)
        elif pattern[j] == "]":
            return j + 1
        else:
            j += 1
    return n
