"""A grammar: regexes (rules) that call each other, as one typed value (`Grammar`).

A flat regex copies every sub-pattern once per context it can appear in: the value of an optional member is
spelled once "after the first member" and once "after a comma", and a nested object multiplies that per level, so
a schema whose documents are small can unroll into millions of DFA states. In a grammar a big sub-pattern is
written once, as a rule, and its uses *call* it (a recursive transition network, like the per-rule automata of
xgrammar or llguidance); `grammar_dfa.GrammarDFA` is its automaton.

    Grammar    root (rule 0) and rules (1, 2, ...): regex texts; hashable and compared by value, so it keys
               memos and caches as it is (the schema compiler and the Lark front end build it, `build_automaton`
               takes it where a plain regex is a `str`)
    a call     \\x02 D D D       inside a rule's text: the mark byte 0x02, then the callee's number in three digit
                                bytes (0x0E..0x1F), how a call reaches the byte DFA of its rule; JSON text never
                                holds raw control bytes, so no document byte is mistaken for a call (rule texts
                                must not match raw 0x02 or 0x0E..0x1F themselves)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["MARK", "MAX_RULES", "Grammar", "call_regex", "describe", "inline_grammar"]

MARK = 0x02
DIGITS = list(range(0x0E, 0x20))  # 18 digit bytes
WIDTH = 3
MAX_RULES = len(DIGITS) ** WIDTH


@lru_cache(maxsize=MAX_RULES)
def call_regex(rule: int) -> str:
    """The regex text of a call to rule number `rule` (1 .. MAX_RULES - 1); memoised (a translation writes a call
    wherever a rule is used)."""
    if not 0 < rule < MAX_RULES:
        raise ValueError(f"rule number {rule} out of range 1..{MAX_RULES - 1}")
    digits = []
    for _ in range(WIDTH):
        rule, digit = divmod(rule, len(DIGITS))
        digits.append(DIGITS[digit])
    return "\\x02" + "".join(f"\\x{d:02x}" for d in reversed(digits))


@dataclass(frozen=True, slots=True)
class Grammar:
    """Regex rules that call each other (`call_regex`); documents match the root.

    Example:
        >>> Grammar(f"a{call_regex(1)}c", ("b|d",)).texts[1]
        'b|d'
    """

    root: str  # rule 0's regex text, where documents start
    rules: tuple[str, ...]  # rule n's regex text at n - 1 (a call to n is `call_regex(n)`)

    def __post_init__(self) -> None:
        if not isinstance(self.root, str):
            raise TypeError(f"Grammar.root must be regex text (str), got {type(self.root).__name__}")
        if not isinstance(self.rules, tuple):  # (a list from a caller: a tuple, so the value stays hashable)
            object.__setattr__(self, "rules", tuple(self.rules))
        if not all(isinstance(rule, str) for rule in self.rules):
            raise TypeError("Grammar.rules must be regex texts (str)")

    @property
    def texts(self) -> tuple[str, ...]:
        """Every rule's text by number: the root, then rule 1, 2, ..."""
        return (self.root, *self.rules)

    @property
    def num_chars(self) -> int:
        """Characters of all rule texts together (sizes in messages)."""
        return sum(map(len, self.texts))


def describe(constraint: str | Grammar, limit: int = 200) -> str:
    """A short description of a constraint for error messages (the first `limit` characters of its root)."""
    if isinstance(constraint, Grammar):
        return (f"grammar of {len(constraint.rules) + 1} rules ({constraint.num_chars:,} characters), root "
                f"{constraint.root[:limit]!r}")
    return repr(constraint[:limit])


def inline_grammar(constraint: str | Grammar) -> str:
    """The flat regex of a constraint (a grammar's calls replaced by their rules' texts; a regex as it is): for tests
    and small grammars.

    Raises:
        ValueError: the grammar is recursive (no flat regex).
    """
    if not isinstance(constraint, Grammar):
        return constraint
    parts = constraint.texts
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
