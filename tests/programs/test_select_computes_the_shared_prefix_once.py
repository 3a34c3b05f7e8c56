"""`select` over several choices computes the text before them once: a leader request computes its new full
blocks and the other choices take them from the prefix cache (the call's counts say so), with the same scores as
scoring every choice from scratch."""

from __future__ import annotations

from hf_paged import programs as hp


def test_the_choices_share_the_new_prefix_blocks(model_tok):
    model, tok = model_tok
    context = "Ticket: my invoice was charged twice this month, please help\nIntent: "  # 8+ full blocks of 8

    @hp.program
    def pick(s):
        s += context + hp.select("intent", ["billing", "refund", "other"])

    state = pick.run(model, tok)
    (record,) = state.calls
    num_prompt = len(tok(context)["input_ids"])
    num_choices = sum(len(tok(c)["input_ids"]) for c in ["billing", "refund", "other"])
    shared = num_prompt // 8 * 8
    assert record.tokens.cached >= 2 * shared  # the two followers read (at least) the leader's full blocks
    assert record.tokens.prefilled <= num_prompt + num_choices  # the context computed once, each choice once
    assert record.tokens.requests == 3
