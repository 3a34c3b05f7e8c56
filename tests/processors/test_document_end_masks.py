"""A document ends at EOS, and EOS only where the document is complete: the masks and `allows` after it.

Both contracts (stock `generate` rows and engine requests) with a regex whose final state also continues (`[0-9]+`
after "1" may take more digits or end): the mask after EOS must allow EOS alone, never the final state's tokens,
and `allows` (resample mode) must refuse EOS where the text so far is not a whole document.
"""

from __future__ import annotations

import torch

from hf_paged.processors import RegexLogitsProcessor
from tests.processors.toy_tokenizers import byte_level_tokenizer

TOK = byte_level_tokenizer()
V = TOK.get_vocab()
EOS, END, PAD, ONE, TWO, DOT = V["<eos>"], V["<|end|>"], V["<pad>"], V["1"], V["2"], V["."]
WIDTH = 279


def allowed(scores: torch.Tensor) -> list[list[int]]:
    return [(row != float("-inf")).nonzero().flatten().tolist() for row in scores]


def test_a_generate_row_after_eos_allows_only_eos_even_from_a_state_that_continues():
    proc = RegexLogitsProcessor(r"[0-9]+(\.[0-9]+)?", TOK, eos_token_id=[EOS, END])
    proc(torch.tensor([[5]]), torch.zeros(1, WIDTH))
    after_one = allowed(proc(torch.tensor([[5, ONE]]), torch.zeros(1, WIDTH)))[0]
    assert EOS in after_one and TWO in after_one and DOT in after_one  # "1" is complete and may go on
    # the row ended with EOS: from now on only the EOS ids, whatever the state before EOS allowed
    assert allowed(proc(torch.tensor([[5, ONE, EOS]]), torch.zeros(1, WIDTH))) == [[EOS, END]]
    assert allowed(proc(torch.tensor([[5, ONE, EOS, PAD]]), torch.zeros(1, WIDTH))) == [[EOS, END]]


def test_an_engine_request_after_eos_allows_only_eos():
    proc = RegexLogitsProcessor(r"[0-9]+", TOK)
    out = proc.process_rows(["r"], [[ONE, EOS]], torch.zeros(1, WIDTH))
    assert allowed(out) == [[EOS]]
    assert proc.is_complete("r")
    assert not proc.allows("r", [ONE, EOS], TWO) and proc.allows("r", [ONE, EOS], EOS)


def test_allows_refuses_eos_where_the_document_is_not_complete():
    proc = RegexLogitsProcessor(r"[0-9]+\.[0-9]", TOK)
    assert not proc.allows("r", [], EOS)  # nothing written yet
    assert not proc.allows("r", [ONE], EOS)  # "1": the pattern needs ".d"
    assert not proc.allows("r", [ONE, DOT], EOS)  # "1."
    assert proc.allows("r", [ONE, DOT, TWO], EOS)  # "1.2": complete
    assert not proc.allows("r", [ONE, DOT, TWO], TWO)  # and nothing may follow it
    assert proc.error("r") is None  # asking never ends the document
