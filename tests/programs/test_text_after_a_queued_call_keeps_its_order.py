"""Text appended while a call is still queued waits its turn: `s += "Q: " + hp.gen("a")` then `s += " then"` gives
"Q: " + a + " then", and the next call's prompt is that text, as stock generate sees it."""

from __future__ import annotations

from hf_paged import programs as hp


def test_text_after_a_queued_gen_lands_after_its_value(model_tok):
    model, tok = model_tok

    @hp.program
    def ordered(s):
        s += "Q: " + hp.gen("a", max_tokens=8)
        s += " then more"  # plain text while the gen above is still running
        s += " and" + hp.gen("b", max_tokens=4)

    state = ordered.run(model, tok)
    assert state.text == "Q: " + state["a"] + " then more and" + state["b"]
    assert [call.name for call in state.calls] == ["a", "b"]
    prompt = tok("Q: ")["input_ids"]
    assert state.token_ids[: len(prompt)] == prompt
