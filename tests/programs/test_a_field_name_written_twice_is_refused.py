"""A program state whose calls write the same field name twice kept only the second value, silently (a template
refuses a duplicate hole). Now the second `s += ...` raises a FieldConstraintError naming the field, before anything
of it is queued. Forks are apart: a fork may write a name it copied from its parent, and a parent one its forks
wrote (`s[name]` reads the state's own field first, then the list of its forks' values, as the README says)."""

from __future__ import annotations

import pytest

from hf_paged import programs as hp
from hf_paged.programs.errors import FieldConstraintError


def test_a_second_gen_of_the_same_name_is_refused(model_tok):
    model, tok = model_tok

    @hp.program
    def twice(s):
        s += "A: " + hp.gen("x", max_tokens=2) + "\n"
        s += "B: " + hp.select("x", ["yes", "no"])

    with pytest.raises(FieldConstraintError, match=r"hp.select\('x'\): this state already has a call writing field"):
        twice.run(model, tok)


def test_the_same_name_twice_in_one_expression_is_refused(model_tok):
    model, tok = model_tok

    @hp.program
    def twice(s):
        s += hp.gen("x", max_tokens=2) + " and " + hp.gen("x", max_tokens=2)

    with pytest.raises(FieldConstraintError, match="field 'x'") as caught:
        twice.run(model, tok)
    assert "x_{i}" in str(caught.value)


def test_forks_and_their_parent_may_share_names(model_tok):
    model, tok = model_tok

    @hp.program
    def shared(s):
        s += "A: " + hp.gen("x", max_tokens=2) + "\n"
        for fork in s.fork(2):
            fork += "B: " + hp.gen("x", max_tokens=2) + hp.gen("y", max_tokens=2)
        forks_y = s["y"]
        s += "C: " + hp.gen("y", max_tokens=2)
        return forks_y

    state = shared.run(model, tok)
    assert isinstance(state["x"], str) and isinstance(state["y"], str)  # the parent's own fields first
    assert isinstance(state.return_value, list) and len(state.return_value) == 2  # the forks' values, read before
    assert [fork["x"] for fork in state.forks] == [fork.calls[0].value for fork in state.forks]
