"""Typed errors of hf_paged. Every message names the problem and the fix.

Each class also derives from the builtin a caller would catch without knowing us (`ValueError`, `TypeError`,
`RuntimeError`), so `except ValueError` keeps working.
"""

from __future__ import annotations

__all__ = [
    "CliError",
    "GrammarError",
    "GrammarSyntaxError",
    "HfPagedError",
    "InvalidConfigError",
    "InvalidPromptError",
    "InvalidRegexError",
    "InvalidSchemaError",
    "KVBlockCorruptError",
    "KVBlockMismatchError",
    "KVDirectoryInUseError",
    "KVTransferError",
    "LeftRecursionError",
    "OutOfBlocksError",
    "PrefixPinLimitError",
    "PromptTooLongError",
    "RequestFailedError",
    "SamplingError",
    "SchemaError",
    "SchemaTooComplexError",
    "StoppingCriterionError",
    "TokenizerError",
    "UndefinedRuleError",
    "UnsatisfiableSchemaError",
    "UnsupportedGenerationError",
    "UnsupportedGrammarError",
    "UnsupportedModelError",
    "UnsupportedSchemaError",
]


class HfPagedError(Exception):
    """Base class of every error raised by hf_paged."""


class OutOfBlocksError(HfPagedError, RuntimeError):
    """The block pool cannot hold what was asked for, even after evicting and preempting everything it may."""


class PrefixPinLimitError(HfPagedError, ValueError):
    """Pinning a prefix would pin more of the block pool than `PagedConfig.prefix_pin_share` allows."""


class InvalidConfigError(HfPagedError, ValueError, TypeError):
    """A setting cannot be used: a `PagedConfig` field (or a `wrap` argument) of the wrong type or value, or a
    KV pool larger than the device's memory. The message names the field, the value and the fix.

    Derives from both `ValueError` and `TypeError` (a wrong value and a wrong type are both bad settings), so
    callers that catch either keep working.
    """


class InvalidPromptError(HfPagedError, ValueError):
    """A prompt is empty or holds token ids outside the model's vocabulary (negative ones included)."""


class PromptTooLongError(HfPagedError, ValueError):
    """A prompt (plus the tokens to generate) exceeds the model's maximum length or the whole block pool."""


class UnsupportedModelError(HfPagedError, TypeError):
    """`wrap` was given a model whose attention hf_paged cannot drive."""


class UnsupportedGenerationError(HfPagedError, ValueError):
    """A generation option that the paged engine does not implement was asked for explicitly."""


class StoppingCriterionError(HfPagedError, RuntimeError):
    """A caller's stopping criterion raised inside a wrapped `generate` (that call's requests were aborted)."""


class SamplingError(HfPagedError, ValueError):
    """A request's sampling distribution is not a distribution (NaN or infinite after its temperature, penalties
    and processors); only that request fails."""


class RequestFailedError(HfPagedError, RuntimeError):
    """A request ended FAILED; `generate` re-raises the first such error for a batch it cannot complete."""


class SchemaError(HfPagedError, ValueError):
    """Base class of the constrained-decoding errors (schema, regex, choices)."""


class InvalidSchemaError(SchemaError):
    """The schema is not valid JSON, or not a JSON Schema."""


class UnsupportedSchemaError(SchemaError):
    """The schema uses a keyword we cannot enforce exactly; the message names it and its JSON pointer."""


class UnsatisfiableSchemaError(SchemaError):
    """No JSON document satisfies the schema (or no token sequence of this vocabulary can spell one)."""


class SchemaTooComplexError(SchemaError):
    """Compiling the schema would exceed its `CompileBudget` (counts of work: states, edges, steps; never time)."""


class InvalidRegexError(SchemaError):
    """A `pattern` or user regex does not compile."""


class TokenizerError(HfPagedError, ValueError):
    """The tokenizer cannot be turned into a vocabulary (e.g. it has no EOS token)."""


class GrammarError(SchemaError):
    """A grammar given to `GrammarLogitsProcessor` (Lark EBNF) cannot be compiled; the subclasses say why."""


class GrammarSyntaxError(GrammarError):
    """The grammar text does not parse as Lark EBNF; the message names the line and column."""


class UndefinedRuleError(GrammarError):
    """The grammar uses a rule or terminal it never defines (or imports), or has no start rule."""


class LeftRecursionError(GrammarError):
    """Rules that call each other before reading any text (indirect or hidden left recursion), which a call-stack
    automaton cannot run; direct left recursion (`expr: expr "+" term | term`) is rewritten, never refused."""


class UnsupportedGrammarError(GrammarError):
    """The grammar uses a Lark feature we do not compile (templates, `%declare`, look-around in a terminal, ...)."""


class CliError(HfPagedError, ValueError):
    """A user error of an `hf-paged` command (a model that is not there, a flag that cannot work): printed as one
    line, exit status 2."""


class KVTransferError(HfPagedError, RuntimeError):
    """A KV block could not be moved in or out of an engine (`hf_paged.kv_transfer`: another engine's store, the
    disk tier). The engine never raises it at a caller: a block that fails to load is recomputed and counted."""


class KVBlockMismatchError(KVTransferError, ValueError):
    """A stored KV block was made for another layout: another model (its fingerprint), block size, storage format,
    number of layers or KV heads, or another prefix. The message names the field and both values; it is never
    loaded."""


class KVBlockCorruptError(KVTransferError, ValueError):
    """A stored KV block is truncated or its checksum does not match its contents; it is never loaded (the disk
    tier deletes the file)."""


class KVDirectoryInUseError(InvalidConfigError):
    """A KV directory (`PagedConfig.kv_offload_dir`, a `DirectoryStore`) is held by another process: each engine
    process needs a directory of its own (the store counts its files alone, and writes and deletes them as the only
    writer). The message names the directory and the pid holding it, when readable."""
