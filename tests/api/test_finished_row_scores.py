"""`output_scores` / `output_logits` of a batch where one row ends early (EOS), against stock `generate` in fp32
greedy: equal for every row while it runs; once a row has ended, stock goes on running it on pad tokens and reports
those throw-away scores, while ours hold -inf with 0 at `pad_token_id` (README, "Differences from stock"), so that
`compute_transition_scores` gives 0 at the pads and a row's sum is its sequence log-probability."""

from __future__ import annotations

import torch

import hf_paged
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


def test_scores_and_logits_of_rows_that_ended_early():
    prompts = ragged_prompts([5, 9, 7], seed=3)
    ids, mask = left_pad(prompts)
    stock_model = tiny_model("llama")
    free = stock_model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    eos = int(free[0, ids.shape[1] + 1])  # row 0 ends at its second token
    kwargs = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "eos_token_id": eos,
              "pad_token_id": 0, "output_scores": True, "output_logits": True, "return_dict_in_generate": True}
    stock = stock_model.generate(ids, **kwargs)
    model = hf_paged.wrap(tiny_model("llama"))
    try:
        ours = model.generate(ids, **kwargs)
    finally:
        hf_paged.unwrap(model)
    assert torch.equal(ours.sequences, stock.sequences)
    new = stock.sequences[:, ids.shape[1]:]
    ended_at = [next((t for t in range(new.shape[1]) if int(new[r, t]) == eos), new.shape[1]) for r in range(3)]
    assert ended_at[0] == 1 and min(ended_at[1:]) > ended_at[0]  # (row 0 ended early; the others ran on)
    filler = torch.full((ours.scores[0].shape[1],), float("-inf"))
    filler[0] = 0.0
    for what in ("scores", "logits"):
        for t, (a, b) in enumerate(zip(getattr(stock, what), getattr(ours, what), strict=True)):
            for r in range(3):
                if t <= ended_at[r]:  # running (its EOS step included): the same processed scores / raw logits
                    torch.testing.assert_close(b[r], a[r], atol=1e-5, rtol=1e-5)
                else:  # ended: stock's are finite throw-away values; ours the documented filler
                    assert torch.isfinite(a[r]).all() and torch.equal(b[r], filler), (what, t, r)
    transition = stock_model.compute_transition_scores(ours.sequences, ours.scores, normalize_logits=True)
    assert torch.equal(transition[0, ended_at[0] + 1:], torch.zeros(6 - ended_at[0] - 1))
