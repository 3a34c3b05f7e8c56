"""A constrained field whose value takes exactly `max_tokens` tokens still closes: the request gets one token more
than the field (for EOS, or the first token of the literal after a template hole), so the field ends "stop" and
complete, not "length", and the literal after a hole comes from the engine (forced) rather than as text."""

from __future__ import annotations

from hf_paged import programs as hp


def test_a_regex_field_of_exactly_max_tokens_ends_with_stop(model_tok):
    model, tok = model_tok

    @hp.program
    def code(s):
        s += "Code: " + hp.gen("code", regex="[0-9]{4}", max_tokens=4)  # 4 bytes: 4 tokens of the byte tokenizer

    state = code.run(model, tok)
    (record,) = state.calls
    assert len(state["code"]) == 4 and state["code"].isdigit()
    assert record.finish_reason == "stop" and record.valid
    assert record.tokens.generated == 5  # the 4 digits and EOS, in one request
    assert record.tokens.requests == 1
