"""A few draws of `tests/fuzz/schedules.py` in every run: seeds 0-9, and 7 chosen so that together they hold every
family and every feature the draw mixes in (forks, aborts, EOS, the disk tier, swap, a pool of one request's
blocks, prompt lookup, a draft model, sparse prefill, seeded sampling, a second round over finished requests).
Longer runs: `python -m tests.fuzz.schedules --seeds 1000`."""

from __future__ import annotations

import pytest

from tests.fuzz.schedules import draw, run

COVERING_SEEDS = [60, 11, 325, 365, 338, 95, 267]


@pytest.mark.parametrize("seed", [*range(10), *COVERING_SEEDS])
def test_a_random_schedule_gives_each_request_stock_greedy_tokens(seed):
    outcome, detail = run(draw(seed))
    assert outcome in ("ok", "refused"), f"seed {seed}: {outcome}: {detail}"
