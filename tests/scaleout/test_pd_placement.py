"""The prefill placement rule of prefill/decode disaggregation (`pd_placement.py`): its cases, exact costs, the
ledger's bookkeeping and its input checks. Pure: no Ray, no engine."""

from __future__ import annotations

import math

import pytest

from hf_paged.scaleout.pd_placement import LOCAL_SLOWDOWN, PlacementLedger, Side, place_prefill, slowdown_for


def place(num_tokens, queued_remote=0, queued_local=0, local_budget=32, **kw):
    return place_prefill(num_tokens, block_size=16, queued_remote=queued_remote, queued_local=queued_local,
                         local_budget=local_budget, **kw)


def test_an_idle_prefill_side_takes_every_prompt_with_a_block_to_hand_over():
    for n in (17, 64, 1000, 4000):
        p = place(n)
        assert p.side is Side.PREFILL and p.handover
        assert p.remote_cost == n and p.local_cost == LOCAL_SLOWDOWN * 32 * math.ceil(n / 32)


def test_a_prompt_without_a_full_block_before_its_last_token_is_local_whatever_the_queues():
    for n in (0, 1, 16):  # the block holding the last token never travels: 16 tokens hand nothing over
        p = place(n, queued_remote=0, local_budget=None)
        assert p.side is Side.LOCAL and not p.handover
    assert place(17).handover


def test_a_short_prompt_behind_a_long_queue_is_prefilled_locally():
    # 64 tokens locally: 3 x 32 x 2 = 192 token-times; remotely: queue + 64
    assert place(64, queued_remote=127).side is Side.PREFILL  # 191 < 192: the prefill side is (just) sooner
    assert place(64, queued_remote=129).side is Side.LOCAL  # 193 > 192
    p = place(64, queued_remote=2000)
    assert p.side is Side.LOCAL and p.remote_cost == 2064 and p.local_cost == 192


def test_a_long_prompt_stays_remote_unless_the_queue_is_longer_than_its_local_cost():
    # 1024 tokens locally: 3 x 1024 = 3072; remotely: queue + 1024
    assert place(1024, queued_remote=2000).side is Side.PREFILL
    assert place(1024, queued_remote=2100).side is Side.LOCAL


def test_the_rule_is_relative_scaling_every_count_keeps_the_decision():
    for n, queued_remote, queued_local, budget in ((64, 129, 0, 32), (64, 127, 0, 32), (300, 900, 100, 16),
                                                  (300, 1300, 100, 16)):
        side = place(n, queued_remote, queued_local, budget).side
        for k in (2, 5, 10):
            assert place(n * k, queued_remote * k, queued_local * k, budget * k).side is side


def test_local_work_already_queued_counts_and_so_do_the_replicas():
    assert place(64, queued_remote=500).side is Side.LOCAL
    assert place(64, queued_remote=500, queued_local=100).side is Side.PREFILL  # 3 x 32 x ceil(164/32) = 576 > 564
    assert place(64, queued_remote=500, queued_local=100, num_decode_replicas=2).side is Side.LOCAL  # 3x32x4 = 384
    assert place(64, queued_remote=1000, num_prefill_replicas=4).side is Side.LOCAL  # 250 + 64 > 192
    assert place(64, queued_remote=400, num_prefill_replicas=4).side is Side.PREFILL  # 100 + 64 < 192


def test_without_a_decode_budget_nothing_with_a_block_is_local():
    p = place(64, queued_remote=10**6, local_budget=None)
    assert p.side is Side.PREFILL and p.local_cost == math.inf


def test_bad_inputs_raise_naming_the_argument():
    with pytest.raises(ValueError, match="token counts must be finite and >= 0"):
        place(-1)
    with pytest.raises(ValueError, match="queued remote -5"):
        place(10, queued_remote=-5)
    with pytest.raises(ValueError, match="local_budget"):
        place(10, local_budget=0)
    with pytest.raises(ValueError, match="replica counts"):
        place(10, num_prefill_replicas=0)
    with pytest.raises(ValueError, match="slowdown must be >= 1"):
        place(10, slowdown=0.5)


def test_nan_and_inf_are_refused_not_booked():
    """One NaN placement booked NaN on a side, every later comparison was false and every later prompt went to the
    prefill side (h8 F8); an infinite budget or ratio gave NaN costs."""
    nan = math.nan
    for kwargs in ({"queued_remote": nan}, {"queued_local": math.inf}, {"local_budget": math.inf},
                   {"slowdown": nan}):
        with pytest.raises(ValueError):
            place(10, **kwargs)
    with pytest.raises(ValueError, match="finite"):
        place(nan)
    with pytest.raises(ValueError, match="finite and > 1"):
        slowdown_for(math.inf)
    ledger = PlacementLedger(block_size=16, local_budget=32)
    with pytest.raises(ValueError):
        ledger.place(nan)
    assert ledger.queued == {Side.PREFILL: 0, Side.LOCAL: 0}


def test_the_ledger_books_each_side_until_done():
    ledger = PlacementLedger(block_size=16, local_budget=32)
    long_ = ledger.place(1024)
    assert long_.side is Side.PREFILL and ledger.queued == {Side.PREFILL: 1024, Side.LOCAL: 0}
    short = ledger.place(64)  # behind 1024 queued tokens: local
    assert short.side is Side.LOCAL and ledger.queued == {Side.PREFILL: 1024, Side.LOCAL: 64}
    tiny = ledger.place(5)
    assert tiny.side is Side.LOCAL and not tiny.handover
    ledger.done(short)
    ledger.done(tiny)
    ledger.done(long_)
    ledger.check_integrity()
    assert ledger.queued == {Side.PREFILL: 0, Side.LOCAL: 0}
    assert ledger.num_placed == {Side.PREFILL: 1, Side.LOCAL: 2} and ledger.num_no_handover == 1
    assert ledger.place(64).side is Side.PREFILL  # the queue is gone: back to the prefill side
    with pytest.raises(ValueError, match="released twice"):
        ledger.done(short)


def test_a_time_ratio_sets_the_slowdown():
    assert slowdown_for(1.5) == pytest.approx(LOCAL_SLOWDOWN) and slowdown_for(1.25) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="> 1"):
        slowdown_for(1.0)
    assert PlacementLedger(block_size=16, local_budget=16, step_ratio=1.25).slowdown == pytest.approx(5.0)


def test_a_decode_side_about_to_drain_takes_a_long_prompt_it_would_finish_sooner():
    # 2048 tokens behind 3072 on the prefill side: remote 5120. Bounded for ever, local is 3 x 2048 = 6144: remote.
    assert place(2048, queued_remote=3072).side is Side.PREFILL
    # The decodes end after 2000 token-times: 2000 / 3 = 666.7 tokens by then, the other 1381.3 at full speed
    p = place(2048, queued_remote=3072, drain=2000)
    assert p.side is Side.LOCAL and p.local_cost == pytest.approx(2000 + 2048 - 2000 / 3)
    # A prompt done before the drain costs what the bounded steps take (the old rule)
    assert place(64, queued_remote=2000, drain=2000).local_cost == 3 * 32 * 2
    assert place(64, drain=0).local_cost == 64  # nothing decodes: a prefill replica's speed, so the idle prefill
    assert place(64, drain=0).side is Side.PREFILL  # side still wins the tie
    with pytest.raises(ValueError, match="drain"):
        place(64, drain=-1)


def test_the_ledger_drains_over_its_longest_booked_decode_once_step_times_are_reported():
    ledger = PlacementLedger(block_size=16, local_budget=16, step_ratio=1.5)
    ledger.start_decode(48)
    ledger.start_decode(8)
    assert ledger.drain() == math.inf  # no step time reported: the decode side is taken to decode for ever
    ledger.decode_step_tokens = 30.0  # a decode-only step takes as long as 30 prefill tokens
    assert ledger.drain() == pytest.approx(48 * 1.5 * 30)  # every bounded step is 1.5 decode-only steps
    ledger.end_decode(48)
    assert ledger.drain() == pytest.approx(8 * 1.5 * 30)
    ledger.end_decode(8)
    assert ledger.drain() == 0
    with pytest.raises(ValueError, match="ended twice"):
        ledger.end_decode(8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ledger.start_decode(-1)
    ledger.start_decode(48)  # 2048 behind 3072: 48 x 45 = 2160 token-times of drain, local 2160 + 2048 - 720
    ledger.place(3072)
    assert ledger.place(2048).side is Side.LOCAL
