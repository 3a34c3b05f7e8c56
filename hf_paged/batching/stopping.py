"""Stop conditions of a request after a token is appended."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from hf_paged.batching.request import Request
from hf_paged.compat import plain_decoder

_SPECIAL_IDS: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()
_DECODERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
T = TypeVar("T")
_CUT = "\ufffd"  # what a decode gives for the bytes of a character cut short
MAX_CUT = 3  # U+FFFD a character still coming can show (`settled`)


def check_stop(request: Request, max_model_len: int) -> str | None:
    """"stop" (EOS id or stop string), "length" (max_new_tokens or the model's maximum length), or None."""
    params = request.params
    last = request.output_ids[-1]
    if last in params.eos_token_ids and len(request.output_ids) >= params.min_new_tokens:
        return "stop"
    # (vLLM's min_tokens: no stop string ends within the first min_new_tokens tokens, as no EOS does)
    if params.stop_strings and len(request.output_ids) > params.min_new_tokens and _ends_with_stop_string(request):
        return "stop"
    # The model's positions bound the whole sequence, prompt and output (stock's MaxLengthCriteria reminds past
    # max_position_embeddings tokens); a prompt of all of them still gets its first token (prompt_check.py)
    if len(request.output_ids) >= params.max_new_tokens or request.num_tokens >= max_model_len:
        return "length"
    return None


def _ends_with_stop_string(request: Request) -> bool:
    """A stop string in the output's tail, read two ways: with special tokens spelled out (a stop string that is a
    special token's text, "<|im_end|>", as stock's `StopStringCriteria` and lm-eval's `until` match it), and as the
    text a client sees, special tokens skipped (the server's text; vLLM's stop check reads that text): "a", a special
    token, "b" holds the stop string "ab" there, and the server cut its text at it, so the request must end too
    (it ran on to max_tokens before, its text already cut)."""
    stops = request.params.stop_strings
    tokenizer = request.params.tokenizer
    # A stop string of k characters spans at most 4k tokens (every token decodes to >= 1 character, or to part of
    # a multi-byte character: 4 bytes each at most); decode only that tail, not the whole output. A stop that holds
    # U+FFFD reads a few tokens more (`_new_match`).
    cut = any(_CUT in s for s in stops)
    window = 4 * max(len(s) for s in stops) + (8 if cut else 1)
    output = request.output_ids
    tail = output[-window:]
    decode = _decoder(tokenizer)
    first = len(output) - len(tail)  # the tail's first token's index; min_new_tokens: no match ends in those tokens
    if _new_match(decode, tail, stops, cut, skip=False, floor=max(0, request.params.min_new_tokens - first)):
        return True
    special = special_ids(tokenizer)
    if not special.intersection(tail):
        return False
    if cut and output[-1] in special:  # skipped, it settles no text there
        return False
    # special tokens show no text there: the window counts the others only
    shown: list[int] = []
    floor = 0  # shown tokens among the first min_new_tokens
    for index in range(len(output) - 1, -1, -1):
        if output[index] not in special:
            shown.append(output[index])
            floor += index < request.params.min_new_tokens
            if len(shown) == window:
                break
    return _new_match(decode, shown[::-1], stops, cut, skip=True, floor=floor)


def _new_match(decode: Callable[..., str], ids: list[int], stops: list[str], cut: bool, skip: bool,
               floor: int = 0) -> bool:
    """A stop string in the text of `ids` (`settled`). With a stop that holds U+FFFD (`cut`): only a match that ends
    in text the last id settled counts, because a tail that begins inside a character decodes its first bytes to
    U+FFFD; the text before was checked as it settled, so this reads a bounded tail too (reading the whole output
    made such a stop cost a decode of the whole output every step: quadratic over a long generation). The tail
    has >= 4k + 4 tokens before the last one, past a cut character of <= 3: >= k whole characters, so a k-character
    match that reaches the last id's text starts after the cut. `floor`: the first ids are among the first
    min_new_tokens, where no match may end (vLLM's min_tokens; matches there were not checked as they came)."""
    text = decode(ids, skip_special_tokens=skip)
    if not isinstance(text, str):  # (a custom tokenizer's decode: fail this request, naming it)
        raise TypeError(f"tokenizer.decode returned {type(text).__name__}, not str")
    text = settled(text)
    if not cut and not floor:
        return any(s in text for s in stops)
    bound = len(settled(decode(ids[:-1], skip_special_tokens=skip))) if cut else 0  # a match must end past it
    if floor:
        bound = max(bound, len(settled(decode(ids[:floor], skip_special_tokens=skip))))
    return any(text.find(s, max(0, bound - len(s) + 1)) >= 0 for s in stops)


def stop_boundary(request: Request) -> int | None:
    """How many of the output's tokens spell exactly its text before the first stop string (the text a client
    gets, special tokens skipped), or None when that text ends inside a token or no stop string shows in it (a
    match with special tokens spelled out). Read once, when a stop string has ended a constrained request: whether
    the document it cut is complete is asked of those tokens (`RequestLifecycle.end`). A few decodes: the prefix is
    found by bisection (a prefix's text grows with its tokens)."""
    decode = _decoder(request.params.tokenizer)
    output = request.output_ids

    def text_of(k: int) -> str:
        return settled(decode(output[:k], skip_special_tokens=True))

    text = text_of(len(output))
    found = [at for at in (text.find(s) for s in request.params.stop_strings) if at >= 0]
    if not found:
        return None
    cut = min(found)
    lo, hi = 0, len(output)  # the most tokens whose text is no longer than the text before the stop string
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(text_of(mid)) <= cut:
            lo = mid
        else:
            hi = mid - 1
    return lo if text_of(lo) == text[:cut] else None


def _decoder(tokenizer: Any) -> Callable[..., str]:
    """`tokenizer.decode`, or its Rust tokenizer's decode where that is all it runs (`compat.plain_decoder`)."""
    backend = per_tokenizer(_DECODERS, tokenizer, plain_decoder)
    return backend.decode if backend is not None else tokenizer.decode


def settled(text: str) -> str:
    """`text` without the U+FFFD its end decodes to while a character's bytes are still coming: not text yet
    (vLLM's detokenizer holds it back too), so a stop string of U+FFFD does not fire on a valid character's first
    byte. A character still coming has at most 3 of its bytes written, and a decoder shows at most one U+FFFD a
    byte (a byte-fallback decoder one each, a UTF-8 decoder one for them all): only the last `MAX_CUT` U+FFFD are
    held back. The ones before are broken bytes for good, so a run of invalid bytes (a model biased to 0xFF) is text
    a stop string of U+FFFD ends (all of them held back, it ran to max_tokens while the client's text was cut)."""
    held = min(MAX_CUT, len(text) - len(text.rstrip(_CUT)))
    return text[: len(text) - held]


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The ids `decode(skip_special_tokens=True)` drops, once per tokenizer: `all_special_ids` and every added token
    marked special (a chat model's `<|im_start|>`: the backend skips it, `all_special_ids` may not list it)."""
    return per_tokenizer(_SPECIAL_IDS, tokenizer, _special_ids)


def _special_ids(tokenizer: Any) -> frozenset[int]:
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return frozenset(getattr(tokenizer, "all_special_ids", ()) or ()).union(
        i for i, token in added.items() if getattr(token, "special", False))


def per_tokenizer(table: weakref.WeakKeyDictionary, tokenizer: Any, compute: Callable[[Any], T]) -> T:
    """`compute(tokenizer)`, kept in `table` while the tokenizer lives (a tokenizer that takes no weak reference is
    computed for every time)."""
    try:
        return table[tokenizer]
    except (KeyError, TypeError):
        pass
    value = compute(tokenizer)
    try:
        table[tokenizer] = value
    except TypeError:
        pass
    return value
