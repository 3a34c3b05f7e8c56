"""`generate_batch` with `min_new_tokens` and prompts of different lengths: each prompt's EOS is held back for its
own first `min_new_tokens` new tokens (stock's `MinNewTokensLengthLogitsProcessor` counts from that prompt's
length), never from another prompt's length."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

import hf_paged
from tests.tiny_models import tiny_model


def test_each_prompt_holds_eos_back_for_its_own_min_new_tokens():
    model = tiny_model("llama")
    short, long = [5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
    eos = int(model.generate(torch.tensor([long]), max_new_tokens=1, do_sample=False)[0, -1])  # long's 1st pick
    config = GenerationConfig(max_new_tokens=6, min_new_tokens=4, eos_token_id=eos, pad_token_id=0, do_sample=False)
    expected = [model.generate(torch.tensor([p]), generation_config=config)[0, len(p):].tolist() for p in (short, long)]
    hf_paged.wrap(model)
    try:
        outs = model.generate_batch([short, long], config)
        got = [outs["req_0"].generated_tokens, outs["req_1"].generated_tokens]
        assert eos not in expected[1][:4]
        assert [g[:4] for g in got] == [e[:4] for e in expected]
    finally:
        hf_paged.unwrap(model)
