"""The terminals of Lark's `common` module (`%import common.X`), written in our own table.

The definitions follow Lark's `common.lark` (same names, same languages), in Lark syntax read by our own parser,
except two that Lark writes with a lazy match and a look-behind, here regular and equivalent as sets of strings:
ESCAPED_STRING (a double-quoted string without newlines whose inner quotes and final character are escaped) and
C_COMMENT (`/* ... */` without an inner `*/`). Lark's helpers `_STRING_INNER` / `_STRING_ESC_INNER` are not
importable.
"""

from __future__ import annotations

__all__ = ["COMMON_SOURCE"]

COMMON_SOURCE = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT

INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT

_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT

NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER

ESCAPED_STRING: /"(?:[^"\\\n]|\\.)*"/

LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"

LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+

CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*

WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+

CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+

SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: /\/\*(?:[^*]|\*+[^*\/])*\*+\//
SQL_COMMENT: /--[^\n]*/
"""
