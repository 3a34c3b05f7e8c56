"""A call that fails in one fork (here its validator raises) ends the program at once: the program's join raised
the first error only after waiting for every state before it in order and for the failing fork's siblings to
generate all their tokens (8.9 s in the report; `fill(parallel=...)` already aborted its forks). Now any state's
failure wakes the join, the program is aborted, and the siblings' requests end with it. Counted in work, not
seconds: the siblings generate a small part of their budget (the fixture checks that no request and no block is left).

(A fork's error is not recoverable inside the program: the program's final join raises it whether or not a read
caught it, so aborting the run on it loses no result.)"""

from __future__ import annotations

import pytest

from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from hf_paged.programs.errors import ValidatorError

BUDGET = 300  # each sibling's tokens (a regex that cannot end earlier: neither EOS nor a stop cuts it short)


def _refuse(value: str) -> bool:
    raise ZeroDivisionError("no")


@pytest.mark.parametrize("failing", [0, 2])  # the first fork, and a fork after two long ones
def test_a_validator_error_in_one_fork_aborts_the_others(model_tok, failing):
    model, tok = model_tok
    engine = engine_of(model)
    before = engine.stats()

    @hp.program
    def forks(s):
        s += "Q: "
        for i, fork in enumerate(s.fork(3)):
            if i == failing:
                fork += hp.gen("a", max_tokens=2, validator=_refuse)
            else:
                fork += hp.gen("a", max_tokens=BUDGET, regex=f"[a-z]{{{BUDGET}}}")

    with pytest.raises(ValidatorError, match="field 'a'"):
        forks.run(model, tok)
    after = engine.stats()
    generated = after["generated_tokens"] - before["generated_tokens"]
    assert generated < BUDGET // 2, generated  # two siblings would make 2 * BUDGET
    engine.check_integrity()


def test_a_read_inside_the_program_raises_the_first_failure_at_once(model_tok):
    model, tok = model_tok
    engine = engine_of(model)
    before = engine.stats()

    @hp.program
    def forks(s):
        s += "Q: "
        for i, fork in enumerate(s.fork(3)):
            if i == 2:
                fork += hp.gen("a", max_tokens=2, validator=_refuse)
            else:
                fork += hp.gen("a", max_tokens=BUDGET, regex=f"[a-z]{{{BUDGET}}}")
        return s["a"]  # waits for the forks: the last one's error, not the first two's tokens

    with pytest.raises(ValidatorError, match="field 'a'"):
        forks.run(model, tok)
    assert engine.stats()["generated_tokens"] - before["generated_tokens"] < BUDGET // 2


def test_a_forked_child_gets_fresh_locks_for_the_run():
    from hf_paged.programs.backend import RunContext

    run = RunContext(None)
    old_lock, old_settled = run._lock, run.settled
    run.settled.acquire()  # held by a thread of the parent when the process forked
    run._after_fork_in_child()
    assert run._lock is not old_lock and run.settled is not old_settled
    assert run.settled.acquire(blocking=False)
    old_settled.release()
