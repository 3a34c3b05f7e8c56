"""Tokenizer -> outlines-core vocabulary: byte mapping, specials, added tokens, EOS ids, memoisation."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from hf_paged.errors import TokenizerError
from hf_paged.processors.index.vocabulary import build_vocabulary, bytes_to_unicode, token_bytes_map
from tests.processors.toy_tokenizers import byte_level_tokenizer, ids_of, sentencepiece_tokenizer


def test_bytes_to_unicode_is_a_bijection_over_256_bytes():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"


def test_byte_level_tokens_map_to_their_bytes():
    tok = byte_level_tokenizer()
    mapping, special, kind = token_bytes_map(tok)
    assert kind == "byte_level"
    vocab = tok.get_vocab()
    assert mapping[vocab['Ġ"']] == b' "'
    assert mapping[vocab["}Ċ"]] == b"}\n"
    assert mapping[vocab["Ã"]] == b"\xc3"  # half of a UTF-8 character stays a raw byte
    assert mapping[vocab["<tool>"]] == b"<tool>"  # added non-special token: literal content
    assert special == {vocab["<eos>"], vocab["<pad>"], vocab["<|end|>"]}
    assert not special & set(mapping)
    text = '{"name": "é1"}\n'
    assert b"".join(mapping[i] for i in ids_of(tok, text)) == text.encode()


def test_sentencepiece_byte_fallback_and_space_marker():
    tok = sentencepiece_tokenizer()
    mapping, special, kind = token_bytes_map(tok)
    assert kind == "sentencepiece"
    vocab = tok.get_vocab()
    assert mapping[vocab["<0x0A>"]] == b"\n"
    assert mapping[vocab["<0xC3>"]] == b"\xc3"
    assert mapping[vocab['▁"']] == b' "'
    assert mapping[vocab["é"]] == "é".encode()
    assert special == {0, 1, 2}
    text = '{"name": "é1"}'
    assert b"".join(mapping[i] for i in ids_of(tok, text)) == text.encode()


def test_vocabulary_is_memoised_and_fingerprinted():
    tok = byte_level_tokenizer()
    first = build_vocabulary(tok)
    assert build_vocabulary(tok) is first
    assert first.eos_token_ids == (tok.eos_token_id,)
    assert first.vocab_size == len(tok) == 279
    assert first.num_tokens == 256 + 19 + 1  # bytes + merges + <tool>; specials excluded
    other = build_vocabulary(sentencepiece_tokenizer())
    assert other.fingerprint != first.fingerprint
    assert len(first.fingerprint) == 32


def test_several_eos_ids_make_another_vocabulary():
    tok = byte_level_tokenizer()
    end = tok.convert_tokens_to_ids("<|end|>")
    multi = build_vocabulary(tok, eos_token_id=[tok.eos_token_id, end])
    assert multi.eos_token_ids == (tok.eos_token_id, end)
    assert multi.fingerprint != build_vocabulary(tok).fingerprint
    assert multi.vocabulary.get_eos_token_id() == tok.eos_token_id


def test_tokenizer_without_eos_is_refused():
    raw = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    with pytest.raises(TokenizerError, match="eos_token_id="):
        build_vocabulary(tok)
    assert build_vocabulary(tok, eos_token_id=1).eos_token_ids == (1,)


@pytest.mark.parametrize("bad, words", [
    (10**9, "not an id of the tokenizer's vocabulary (0..278)"),  # (every step's mask was that wide: 30 GB)
    (279, "not an id of the tokenizer's vocabulary"),
    (-1, "not an id"),
    ([3, 10**9], "1000000000"),
    ("x", "a token id (an int)"),  # (Python's "invalid literal for int()" before)
    (3.5, "a token id (an int)"),  # ("'float' object is not iterable" before)
    ([], "non-empty list"),
    ([True], "a token id"),
])
def test_a_bad_eos_token_id_is_refused_naming_it(bad, words):
    """Found by a hostile pass (session 31): an id past the vocabulary was accepted, and a later mask tried to take
    memory for that many columns; a text or a float raised Python's own errors."""
    with pytest.raises(TokenizerError, match="eos_token_id") as caught:
        build_vocabulary(byte_level_tokenizer(), eos_token_id=bad)
    assert words in str(caught.value)


def test_eos_token_ids_as_tensors_or_numpy_ints_are_ids():
    import numpy as np
    import torch

    tok = byte_level_tokenizer()
    for given in (torch.tensor(tok.eos_token_id), np.int64(tok.eos_token_id), torch.tensor([tok.eos_token_id])):
        assert build_vocabulary(tok, eos_token_id=given).eos_token_ids == (tok.eos_token_id,)
