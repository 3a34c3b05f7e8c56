"""A field with overlapping stop strings ends before the earliest one in its text: with stops [T[j:j+2], T[j+1]]
(the second inside the first) the value is T[:j], the text before the longer stop, which starts first."""

from __future__ import annotations

from hf_paged import programs as hp


def test_the_value_is_cut_at_the_earliest_of_overlapping_stops(model_tok):
    model, tok = model_tok

    @hp.program
    def free(s, stop):
        s += "Story: " + hp.gen("x", max_tokens=24, stop=stop)

    text = free.run(model, tok, stop=None)["x"]
    j = next(j for j in range(1, len(text) - 1)
             if text[j + 1] not in text[: j + 1] and text[j: j + 2] not in text[: j + 1])  # first occurrences
    state = free.run(model, tok, stop=[text[j + 1], text[j: j + 2]])
    assert state["x"] == text[:j]
    assert state.calls[0].finish_reason == "stop"
