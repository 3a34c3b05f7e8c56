"""Any Hugging Face tokenizer -> an outlines-core `Vocabulary` (token bytes -> ids), memoised by fingerprint.

outlines-core walks the regex automaton over the *bytes* each token decodes to, so every token must be mapped
back to its raw bytes, offline:

| tokenizer family                     | stored token string      | bytes                                  |
|--------------------------------------|--------------------------|----------------------------------------|
| byte-level BPE (GPT-2, Llama 3, Qwen) | `Ġ{"`                    | inverse of GPT-2's `bytes_to_unicode`  |
| SentencePiece with byte fallback      | `▁{"`, `<0x0A>`          | `▁` -> space, `<0xNN>` -> one byte      |
| added non-special tokens             | `<tool>`, `\n\n`, `ĠX`   | as the family's tokens (the decoder    |
|                                      |                          | reads them too): `ĠX` -> " X" in a     |
|                                      |                          | byte-level tokenizer, `\n\n` as UTF-8  |
| anything else (WordPiece, ...)        | `##ab`                   | `tokenizer.decode([id])`               |

Special tokens (BOS, PAD, EOS, chat markers...) are never part of the automaton: EOS is handled by the guide
(outlines-core takes exactly ONE EOS id; the others are mirrored onto its bit by the processors). A constraint
that allows the text `<|im_start|>` gets it spelled by regular tokens, never as the special token (outlines does
the same); added tokens that are not special are text like any other.

What the processors match is the tokens' bytes in sequence, as `decode` writes them after a prompt. Two decode
options rewrite that text, so decode generated ids with them off to read back what was matched:
- a SentencePiece dummy prefix (Metaspace `prepend_scheme="always"`, Llama's `add_dummy_prefix`): decoding the
  generated ids alone drops the first token's leading space; `▁{` is `" {"` here (outlines reads it the same way),
  so a constraint without leading whitespace never starts with it;
- `clean_up_tokenization_spaces=True` (WordPiece and Unigram tokenizers; transformers 5 ignores it for BPE) turns
  `"a ."` into `"a."`.
Logits may be wider than `vocab_size` (padded lm_head rows: always masked), never narrower than
`min_logits_width` (the processors raise `TokenizerError`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.errors import TokenizerError

__all__ = ["TokenVocabulary", "build_vocabulary", "bytes_to_unicode", "token_bytes_map"]

logger = logging.getLogger(__name__)

_SP_SPACE = "\u2581"  # SentencePiece's "▁" word-boundary marker


@dataclass(slots=True, frozen=True)
class TokenVocabulary:
    """A tokenizer turned into what the guides need; immutable and shared by every processor using it."""

    vocabulary: Any  # outlines_core.Vocabulary (its single EOS id is `eos_token_ids[0]`)
    fingerprint: str  # blake2b hex digest of (token bytes, ids, EOS ids): a cache key stable across processes
    vocab_size: int  # ids run from 0 to vocab_size - 1 (logits may be wider: padded embedding rows)
    eos_token_ids: tuple[int, ...]  # every id that ends a document; the first one is outlines-core's EOS
    num_tokens: int  # regular tokens in the automaton (special tokens excluded)
    kind: str  # "byte_level" | "sentencepiece" | "decode": how token strings were mapped to bytes
    # token bytes -> ids spelling them (regular tokens only): what the lazy token index builds its trie from
    tokens: dict[bytes, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)
    # 1 + the largest id a mask may allow (a regular token or an EOS): logits narrower than this cannot be masked
    # (padded rows past `vocab_size` are fine; special ids past it are never allowed, so they need no column)
    min_logits_width: int = 0


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by every byte-level BPE tokenizer."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def _tokenizer_json(tokenizer: Any) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "to_str"):  # a raw `tokenizers.Tokenizer`
        backend = tokenizer
    if backend is None:
        return {}
    try:
        return json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 -- a backend that cannot serialise itself: fall back to decode()
        return {}


def _decoder_types(decoder: dict | None) -> set[str]:
    if not decoder:
        return set()
    types = {decoder.get("type", "")}
    for sub in decoder.get("decoders", []) or []:
        types |= _decoder_types(sub)
    if decoder.get("type") == "Replace" and decoder.get("pattern", {}).get("String") == _SP_SPACE:
        types.add("ReplaceSpace")
    return types


def _detect_kind(spec: dict) -> str:
    decoders = _decoder_types(spec.get("decoder"))
    if "ByteLevel" in decoders:
        return "byte_level"
    if decoders & {"ByteFallback", "Metaspace", "ReplaceSpace"} or spec.get("model", {}).get("byte_fallback"):
        return "sentencepiece"
    return "decode"


def _byte_level_bytes(token: str) -> bytes | None:
    try:
        return bytes(_UNICODE_TO_BYTE[c] for c in token)
    except KeyError:  # not a byte-level string (e.g. a literal added token): caller uses its UTF-8
        return None


def _sentencepiece_bytes(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace(_SP_SPACE, " ").encode("utf-8")


def _vocab_of(tokenizer: Any) -> dict[str, int]:
    if hasattr(tokenizer, "get_vocab"):
        try:
            return dict(tokenizer.get_vocab(with_added_tokens=True))  # raw `tokenizers.Tokenizer`
        except TypeError:
            return dict(tokenizer.get_vocab())
    raise TokenizerError(
        f"cannot read a vocabulary from {type(tokenizer).__name__}: pass a transformers tokenizer "
        "(AutoTokenizer.from_pretrained(...)) or a `tokenizers.Tokenizer`"
    )


def _special_and_added(tokenizer: Any) -> tuple[set[int], dict[int, str]]:
    """(ids of special tokens, {id: content} of added non-special tokens)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added: dict[int, str] = {}
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if decoder is None and hasattr(tokenizer, "get_added_tokens_decoder"):
        decoder = tokenizer.get_added_tokens_decoder()
    for token_id, token in (decoder or {}).items():
        if getattr(token, "special", False):
            special.add(int(token_id))
        else:
            added[int(token_id)] = str(getattr(token, "content", token))
    return special, added


def token_bytes_map(tokenizer: Any) -> tuple[dict[int, bytes], set[int], str]:
    """Map every non-special token id to the bytes it decodes to.

    Returns:
        `({id: bytes}, special ids, kind)`; `kind` says how strings were mapped (see the module table).
    """
    vocab = _vocab_of(tokenizer)
    special, added = _special_and_added(tokenizer)
    kind = _detect_kind(_tokenizer_json(tokenizer))
    out: dict[int, bytes] = {}
    for token, token_id in vocab.items():
        if token_id in special:
            continue
        if token_id in added:
            # `decode` runs an added token's content through the decoder like any token: a byte-level decoder turns
            # "ĠX" into " X" (and "é", itself a byte-level character, into the lone byte 0xE9), keeping the UTF-8 of
            # contents it cannot read ("\n\n", "  ", "中"); a SentencePiece one turns "▁" into a space
            token = added[token_id]
        if kind == "byte_level":
            raw = _byte_level_bytes(token)
            out[token_id] = raw if raw is not None else token.encode("utf-8")
        elif kind == "sentencepiece":
            out[token_id] = _sentencepiece_bytes(token)
        else:
            out[token_id] = tokenizer.decode([token_id]).encode("utf-8")
    return out, special, kind


def _warn_cleanup(tokenizer: Any) -> None:
    """`clean_up_tokenization_spaces=True` makes `decode` rewrite what the processors matched (`"a ."` -> `"a."`);
    transformers 5 ignores it for BPE models, so only the others are named."""
    if getattr(tokenizer, "clean_up_tokenization_spaces", False) is not True:
        return
    if _tokenizer_json(tokenizer).get("model", {}).get("type") == "BPE":
        return
    logger.warning(
        "%s has clean_up_tokenization_spaces=True: decode(..., clean_up_tokenization_spaces=False) returns the text "
        "a constraint matched (the clean-up removes spaces before punctuation, e.g. 'a .' -> 'a.')",
        type(tokenizer).__name__,
    )


def _eos_ids(tokenizer: Any, eos_token_id: int | Iterable[int] | None, size: int | None = None) -> tuple[int, ...]:
    """The EOS ids asked (default the tokenizer's), each an id of the tokenizer's vocabulary of `size` ids; a
    `TokenizerError` naming `eos_token_id` for anything else (an id past the vocabulary made every step's mask
    that wide: 10**9 asked for 30 GB)."""
    if eos_token_id is None:
        eos_token_id = getattr(tokenizer, "eos_token_id", None)
    if eos_token_id is None:
        raise TokenizerError(
            f"{type(tokenizer).__name__} has no EOS token, so a finished document could never end: pass "
            "`eos_token_id=` (an id or a list of ids, e.g. model.generation_config.eos_token_id)"
        )
    single = isinstance(eos_token_id, str | bytes) or not isinstance(eos_token_id, Iterable) or getattr(
        eos_token_id, "ndim", None) == 0  # (a 0-d tensor or array: one id)
    items = [eos_token_id] if single else list(eos_token_id)
    try:
        if not items or any(isinstance(i, bool | float | str | bytes) for i in items):
            raise TypeError
        ids = tuple(dict.fromkeys(operator.index(i) for i in items))
    except TypeError:
        raise TokenizerError(f"eos_token_id must be a token id (an int) or a non-empty list of them, got "
                             f"{eos_token_id!r:.80}") from None
    bad = [i for i in ids if i < 0 or (size is not None and i >= size)]
    if bad:
        raise TokenizerError(f"eos_token_id {bad[0]} is not an id of the tokenizer's vocabulary (0..{size - 1}); "
                             "pass the model's EOS id (model.generation_config.eos_token_id)" if size is not None
                             else f"eos_token_id must be a non-negative id, got {bad[0]}")
    return ids


def _fingerprint(mapping: dict[int, bytes], eos_ids: tuple[int, ...]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr(eos_ids).encode())
    for token_id in sorted(mapping):
        digest.update(token_id.to_bytes(4, "little"))
        digest.update(len(mapping[token_id]).to_bytes(2, "little"))
        digest.update(mapping[token_id])
    return digest.hexdigest()


_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)
# Both memos are LRUs: a process that meets many tokenizers over its life (a new tokenizer object per request, EOS
# ids chosen per call) must not keep each one. A vocabulary dropped here lives on in the processors and compiled
# indexes that hold it; a later build of the same tokenizer only reads it again (same fingerprint, same indexes).
MAX_VOCABULARIES = 8  # vocabularies (fingerprints) kept: a 150k-token one holds tens of MB
MAX_TOKENIZERS = 64  # tokenizer objects remembered (a weak reference, its size and fingerprint each)
_BY_FINGERPRINT: OrderedDict[str, TokenVocabulary] = OrderedDict()
# (id(tokenizer), eos ids asked) -> (a reference to it, len(tokenizer) when seen, fingerprint): skips re-reading
# a tokenizer already converted. The reference guards against a recycled id() (a new tokenizer at a dead one's
# address gets its own vocabulary, never the dead one's); len() changes when tokens are added, which invalidates
# the entry.
_BY_TOKENIZER: OrderedDict[tuple[int, tuple[int, ...] | None], tuple[Any, int, str]] = OrderedDict()


def _ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep it alive instead (tokenizers are few and long-lived)
        return lambda: obj


def build_vocabulary(tokenizer: Any, eos_token_id: int | Iterable[int] | None = None) -> TokenVocabulary:
    """Turn a tokenizer into a `TokenVocabulary`, memoised by its fingerprint.

    Args:
        tokenizer: a transformers tokenizer (fast) or a `tokenizers.Tokenizer`.
        eos_token_id: the id(s) that end a document; default `tokenizer.eos_token_id`.

    Raises:
        TokenizerError: no EOS id, or a tokenizer whose vocabulary cannot be read.

    Example:
        >>> vocab = build_vocabulary(tokenizer)            # doctest: +SKIP
        >>> vocab.eos_token_ids, vocab.vocab_size           # doctest: +SKIP
        ((50256,), 50257)
    """
    from outlines_core import Vocabulary  # heavy native import, only when a processor is built

    size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.get_vocab_size(with_added_tokens=True)
    asked = None if eos_token_id is None else _eos_ids(tokenizer, eos_token_id, size)
    eos_ids = _eos_ids(tokenizer, asked, size)
    memo_key = (id(tokenizer), asked)
    with _LOCK:
        seen = _BY_TOKENIZER.get(memo_key)
        if seen is not None and seen[0]() is tokenizer and seen[1] == size and seen[2] in _BY_FINGERPRINT:
            _BY_TOKENIZER.move_to_end(memo_key)
            _BY_FINGERPRINT.move_to_end(seen[2])
            return _BY_FINGERPRINT[seen[2]]
    mapping, special, kind = token_bytes_map(tokenizer)
    _warn_cleanup(tokenizer)
    for eos in eos_ids:
        mapping.pop(eos, None)  # an EOS that is not marked special must still never be a regular token
    fingerprint = _fingerprint(mapping, eos_ids)
    with _LOCK:
        cached = _BY_FINGERPRINT.get(fingerprint)
        if cached is None:
            grouped: dict[bytes, list[int]] = {}
            for token_id, raw in mapping.items():
                if raw:  # an empty token can never make progress in the automaton
                    grouped.setdefault(raw, []).append(token_id)
            all_ids = list(mapping) + list(special) + list(eos_ids)
            cached = TokenVocabulary(
                vocabulary=Vocabulary(eos_ids[0], grouped),
                fingerprint=fingerprint,
                vocab_size=max(max(all_ids) + 1, size),
                eos_token_ids=eos_ids,
                num_tokens=sum(len(ids) for ids in grouped.values()),
                kind=kind,
                tokens={raw: tuple(ids) for raw, ids in grouped.items()},
                min_logits_width=max(max((max(ids) for ids in grouped.values()), default=-1), *eos_ids) + 1,
            )
            _BY_FINGERPRINT[fingerprint] = cached
        _BY_FINGERPRINT.move_to_end(fingerprint)
        _BY_TOKENIZER[memo_key] = (_ref(tokenizer), size, fingerprint)
        _BY_TOKENIZER.move_to_end(memo_key)
        _trim(_BY_TOKENIZER, MAX_TOKENIZERS, dead=lambda entry: entry[0]() is None)
        _trim(_BY_FINGERPRINT, MAX_VOCABULARIES)
    return cached


def _trim(memo: OrderedDict, limit: int, dead: Any = None) -> None:
    """Drop `memo`'s entries past `limit`: first those `dead(entry)` names (a collected tokenizer), then the least
    recently used."""
    if len(memo) <= limit:
        return
    if dead is not None:
        for key in [key for key, entry in memo.items() if dead(entry)]:
            del memo[key]
    while len(memo) > limit:
        memo.popitem(last=False)
