"""`head_distances` (head-merge calibration) is the total variation 0.5 * sum |p - q| between two heads' attention
rows, in [0, 1], averaged over the query rows from `skip` on (the first rows see few keys and agree trivially).
The thresholds of `calibrate_head_merge` are in these units, so a distance off by a factor or over the wrong rows
merges the wrong heads."""

import torch

from hf_paged.cache.head_merge_calibrate import head_distances


def maps() -> torch.Tensor:
    """[1 batch, 3 heads, 4 queries, 4 keys]: head 1 equals head 0 from row 2 on, head 2 is disjoint from head 0
    there; rows 0 and 1 disagree the other way round."""
    attn = torch.zeros(1, 3, 4, 4)
    attn[0, :, 0, 0] = 1.0  # row 0 can only look at key 0
    attn[0, 0, 1, 0], attn[0, 1, 1, 1], attn[0, 2, 1, 0] = 1.0, 1.0, 1.0
    attn[0, 0, 2:, 0] = 0.5
    attn[0, 0, 2:, 1] = 0.5
    attn[0, 1, 2:] = attn[0, 0, 2:]
    attn[0, 2, 2:, 2] = 1.0
    return attn


def test_distances_are_total_variation_over_the_rows_from_skip():
    d = head_distances(maps(), skip=2)
    expected = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    torch.testing.assert_close(d, expected)


def test_every_row_counts_when_there_are_no_more_than_skip():
    d = head_distances(maps(), skip=8)  # 4 rows <= 8: all of them
    # heads 0, 1: rows 1 differ wholly (1.0), others agree -> 1/4; heads 0, 2: row 1 agrees, rows 2, 3 disjoint -> 2/4
    torch.testing.assert_close(d[0, 1], torch.tensor(0.25))
    torch.testing.assert_close(d[0, 2], torch.tensor(0.5))
    assert bool((d >= 0).all()) and bool((d <= 1).all()) and torch.equal(d, d.T)
