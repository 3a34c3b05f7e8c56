"""`independent_rows` picks the first candidate row count strictly past the largest one whose product differed: a
CPU where 4-row products still differ gets 8, not 4 (pruning from 4 rows would give other bits)."""

from __future__ import annotations

from hf_paged.batching import row_kernels


def test_the_threshold_is_strictly_past_the_last_differing_row_count(monkeypatch):
    for worst, want in ((0, 4), (3, 4), (4, 8), (15, 16), (16, 32), (64, None)):
        monkeypatch.setattr(row_kernels, "_last_dependent", lambda k, n, worst=worst: worst)
        assert row_kernels.independent_rows({(256, 1024)}) == want, worst
