"""`select` breaks exact ties for the first choice in the caller's order (README: "ties to the first"), as a stable
max over the choices does. A tiny random model never ties exactly, so the backend's scores are replaced: every
choice token gets the same log-probability."""

from __future__ import annotations

import pytest

from hf_paged import programs as hp
from hf_paged.programs.backend import Scored
from hf_paged.programs.connect import backend_for


@hp.program
def pick(s, choices, normalize):
    s += "Pick one: " + hp.select("pick", choices, normalize=normalize)


@pytest.mark.parametrize(("choices", "normalize", "expected"), [
    (["b", "a", "c"], "sum", "b"),  # a three-way tie
    (["x", "yy", "z"], "sum", "x"),  # x and z tie (-1 each) above yy (-2): the first of the two, not the last
    (["yy", "x", "zz"], "mean", "yy"),  # every choice -1 a token
])
def test_an_exact_tie_goes_to_the_first_choice(model_tok, choices, normalize, expected):
    model, tok = model_tok
    backend = backend_for(model, tok)
    real_score = backend.score

    def equal_score(run, what, prompts, start):
        scored = real_score(run, what, prompts, start)  # the real requests (their counts, the pool's accounting)
        return Scored([[-1.0] * len(lp) for lp in scored.logprobs], scored.num_prompt_tokens, scored.num_cached_tokens)

    backend.score = equal_score
    state = pick.run(backend, None, choices=choices, normalize=normalize)
    record = state.calls[0]
    assert record.value == state["pick"] == expected
    assert state.text == "Pick one: " + expected
    best = max(record.scores.values())
    assert next(c for c in choices if record.scores[c] == best) == expected
