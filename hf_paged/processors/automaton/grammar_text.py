"""The text of a grammar: regexes (rules) that call each other, in one string.

A flat regex copies every sub-pattern once per context it can appear in: the value of an optional member is
spelled once "after the first member" and once "after a comma", and a nested object multiplies that per level, so
a schema whose documents are small can unroll into millions of DFA states. In a grammar a big sub-pattern is
written once, as a rule, and its uses *call* it (a recursive transition network, like the per-rule automata of
xgrammar or llguidance); `grammar_dfa.GrammarDFA` is its automaton.

    a call     \\x02 D D D       the mark byte 0x02, then the callee's number in three digit bytes (0x0E..0x1F);
                                JSON text never holds raw control bytes, so no document byte is mistaken for a
                                call (rule texts must not match raw 0x02 or 0x0E..0x1F themselves)
    grammar    GRAMMAR_PREFIX + root + "\\x00" + rule 1 + "\\x00" + rule 2 ...   (one string: cache keys, errors)
"""

from __future__ import annotations

__all__ = ["GRAMMAR_PREFIX", "MARK", "MAX_RULES", "call_regex", "inline_grammar", "join_grammar", "split_grammar"]

GRAMMAR_PREFIX = "\x00grammar\x00"
_SEPARATOR = "\x00"
MARK = 0x02
DIGITS = list(range(0x0E, 0x20))  # 18 digit bytes
WIDTH = 3
MAX_RULES = len(DIGITS) ** WIDTH


def call_regex(rule: int) -> str:
    """The regex text of a call to rule number `rule` (1 .. MAX_RULES - 1)."""
    if not 0 < rule < MAX_RULES:
        raise ValueError(f"rule number {rule} out of range 1..{MAX_RULES - 1}")
    digits = []
    for _ in range(WIDTH):
        rule, digit = divmod(rule, len(DIGITS))
        digits.append(DIGITS[digit])
    return "\\x02" + "".join(f"\\x{d:02x}" for d in reversed(digits))


def join_grammar(root: str, rules: list[str]) -> str:
    """One string naming the grammar (root regex, then rule 1, 2, ...)."""
    return GRAMMAR_PREFIX + _SEPARATOR.join([root, *rules])


def split_grammar(text: str) -> list[str] | None:
    """[root, rule 1, ...] of a grammar string, or None for a plain regex."""
    if not text.startswith(GRAMMAR_PREFIX):
        return None
    return text[len(GRAMMAR_PREFIX):].split(_SEPARATOR)


def inline_grammar(text: str) -> str:
    """The flat regex of a grammar (every call replaced by its rule's text); for tests and small grammars.

    Raises:
        ValueError: the grammar is recursive (no flat regex).
    """
    parts = split_grammar(text)
    if parts is None:
        return text
    flat: dict[int, str] = {}
    open_rules: set[int] = set()

    def expand(rule: int) -> str:
        if rule in open_rules:
            raise ValueError(f"rule {rule} calls itself: a recursive grammar has no flat regex")
        if rule not in flat:
            open_rules.add(rule)
            body = parts[rule]
            for callee in range(len(parts) - 1, 0, -1):  # longest numbers first is moot: all are 3 digits
                marker = call_regex(callee)
                if marker in body:
                    body = body.replace(marker, f"(?:{expand(callee)})")
            flat[rule] = body
            open_rules.discard(rule)
        return flat[rule]

    return expand(0)
