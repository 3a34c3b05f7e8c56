"""The trie of a `TokenVocabulary`, built once per vocabulary and shared (keyed by its fingerprint), with the
per-vocabulary work every compile would otherwise repeat done beside it: the JSON-string token plans
(`string_tokens`, `string_masks`) and, for a large vocabulary, the compiled walks started (`jit.start`).

It sits above `token_trie` and the string-contents modules, which read the trie, so they never import back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.processors import jit
from hf_paged.processors.index.string_masks import body_plan
from hf_paged.processors.index.string_tokens import JSON_KEY_ASCII, JSON_STRING_ASCII, body_tokens
from hf_paged.processors.index.token_trie import TokenTrie, build_token_trie
from hf_paged.processors.index.vocabulary import MAX_VOCABULARIES, TokenVocabulary

__all__ = ["JIT_MIN_TOKENS", "token_trie"]

# Vocabularies from this size on get the compiled walks (`jit.start`); a byte-level vocabulary walks its few hundred
# nodes in Python faster than numba loads (~0.7 s of CPU in the background).
JIT_MIN_TOKENS = 4096
_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)
# An LRU of `vocabulary.MAX_VOCABULARIES` tries: a trie dropped here lives on in the compiled indexes built over it
_BY_FINGERPRINT: OrderedDict[str, TokenTrie] = OrderedDict()


def token_trie(vocab: TokenVocabulary) -> TokenTrie:
    """The trie of `vocab`, built on first use and shared (keyed by the vocabulary's fingerprint)."""
    with _LOCK:
        trie = _BY_FINGERPRINT.get(vocab.fingerprint)
        if trie is None:
            trie = build_token_trie(vocab.tokens, vocab.vocab_size)
            # the contents of JSON strings and of free-form keys, and their bytes past a first one (a key's first
            # character): split and planned once per vocabulary, here (~8 ms), not on a first visit (~2 ms each)
            for ascii_bits, multibyte in ((JSON_STRING_ASCII, True), (JSON_KEY_ASCII, False)):
                for skip_first in (False, True):
                    body_plan(trie, body_tokens(trie, ascii_bits, multibyte, skip_first))
            if vocab.num_tokens >= JIT_MIN_TOKENS:  # (below, the Python walks cost less than loading numba)
                jit.start()  # the compiled walks, loaded (or compiled in a child process) in the background
            _BY_FINGERPRINT[vocab.fingerprint] = trie
            while len(_BY_FINGERPRINT) > MAX_VOCABULARIES:
                _BY_FINGERPRINT.popitem(last=False)
        _BY_FINGERPRINT.move_to_end(vocab.fingerprint)
        return trie
