"""`TextStream` decodes a window since the push before, not the whole output at every push: the same chunks as
the whole decode gives, on byte-level BPE (GPT-2's and a toy one) and SentencePiece (byte fallback, a leading
space stripped), with stop sequences and cut characters; linear work in the output's length."""

from __future__ import annotations

import copy
import random

import pytest
from tokenizers import decoders

from hf_paged.batching.stopping import settled
from hf_paged.serving.text import TextStream
from tests.processors.hostile_inputs import gpt2_or_toy
from tests.processors.toy_tokenizers import byte_level_tokenizer, sentencepiece_tokenizer


class WholeDecode(TextStream):
    """The stream as it was: every push decodes the whole output (the oracle)."""

    def _decoded(self, final: bool) -> str:
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        return text if final else settled(text)


class Counting:
    """A tokenizer that counts the ids it was asked to decode."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.decoded = tokenizer, 0
        self.clean_up_tokenization_spaces = getattr(tokenizer, "clean_up_tokenization_spaces", False)

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _llama_like():
    """The toy SentencePiece tokenizer with Llama's decoder, which strips the decoded text's leading space."""
    tok = sentencepiece_tokenizer()
    tok.backend_tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                                       decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tok


TOKENIZERS = {"gpt2": gpt2_or_toy, "byte_level": byte_level_tokenizer, "sentencepiece": sentencepiece_tokenizer,
              "llama_like": _llama_like}


def _chunks(stream: TextStream, ids: list[int], sizes: list[int]) -> list[tuple[str, str]]:
    """Each push's chunk and the stream's text after it (what log-probability offsets read), then the finish's."""
    out, at = [], 0
    for size in sizes:
        out.append((stream.push(ids[at : at + size]), stream.text))
        at += size
    out.append((stream.finish(), stream.text))
    return out


@pytest.mark.parametrize("name", list(TOKENIZERS))
@pytest.mark.parametrize("seed", range(4))
def test_the_chunks_are_the_whole_decodes(name, seed):
    tokenizer = TOKENIZERS[name]()
    rng = random.Random(seed)
    vocab = len(tokenizer)
    text = "name: {\"a\": 1, \"b\": é2} x é €\nmena"
    for _ in range(6):
        if rng.random() < 0.5:  # real text (whole characters, spaces), or ids drawn at random (cut characters)
            ids = tokenizer(text * rng.randint(1, 4), add_special_tokens=False)["input_ids"]
        else:
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 120))]
        sizes = []
        while sum(sizes) < len(ids):
            sizes.append(rng.choice([1, 1, 1, 2, 3, 7]))
        stop = rng.choice([[], ["\n"], ["me"], ["é2", "xyz"]])
        got = _chunks(TextStream(tokenizer, stop), ids, sizes)
        assert got == _chunks(WholeDecode(tokenizer, stop), ids, sizes), (ids, sizes, stop)


def test_a_tokenizer_that_cleans_up_spaces_keeps_the_whole_decode():
    tokenizer = copy.deepcopy(byte_level_tokenizer())  # (a copy: the cached one is shared with the other tests)
    tokenizer.clean_up_tokenization_spaces = True  # " ." -> "." across tokens: windows would not add up
    ids = tokenizer("a . b , c ! d", add_special_tokens=False)["input_ids"]
    got = _chunks(TextStream(tokenizer), ids, [1] * len(ids))
    assert got == _chunks(WholeDecode(tokenizer), ids, [1] * len(ids))
    assert "".join(chunk for chunk, _ in got) == tokenizer.decode(ids, skip_special_tokens=True)


def test_work_is_linear_in_the_output():
    tokenizer = Counting(gpt2_or_toy())
    ids = tokenizer.tokenizer("the river runs past the stone bridge, é € \n" * 60, add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer, ["STOP"])
    text = "".join(stream.push([i]) for i in ids) + stream.finish()
    assert text == tokenizer.tokenizer.decode(ids, skip_special_tokens=True)
    assert tokenizer.decoded <= 4 * len(ids)  # a window of the push before and this one, its head once more


class Rewriting:
    """A decode that rewrites across tokens (" ." -> ".") without saying so: the windows stop adding up and the
    stream falls back to the whole decode."""

    clean_up_tokenization_spaces = False

    def __init__(self) -> None:
        self.tokenizer = byte_level_tokenizer()

    def decode(self, ids, skip_special_tokens=True):
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens).replace(" .", ".")


def test_windows_that_do_not_add_up_fall_back_to_the_whole_decode():
    tokenizer = Rewriting()
    ids = tokenizer.tokenizer.convert_tokens_to_ids(list("aĠbĠ.ĠcĠ..ĠdĠ.Ġe"))  # one byte a token: " " apart from "."
    got = _chunks(TextStream(tokenizer), ids, [1] * len(ids))
    assert got == _chunks(WholeDecode(tokenizer), ids, [1] * len(ids))
