"""A field written by forks reads from the parent as a list, one entry per fork of the LATEST group that wrote it;
a fork that did not write it gives None."""

from __future__ import annotations

from hf_paged import programs as hp


def test_a_field_of_some_forks_and_of_a_later_group(model_tok):
    model, tok = model_tok

    @hp.program
    def branches(s):
        s += "Start: "
        first = s.fork(2)
        first[0] += hp.gen("o", max_tokens=2)  # the second fork of this group never writes "o"
        first[1] += "x"
        partial = s["o"]
        second = s.fork(2)
        for f in second:
            f += "again " + hp.gen("o", max_tokens=3)
        return partial, first[0]["o"], [f["o"] for f in second]

    state = branches.run(model, tok)
    partial, first_value, second_values = state.return_value
    assert partial == [first_value, None]
    assert state["o"] == second_values  # the latest group that wrote the field
