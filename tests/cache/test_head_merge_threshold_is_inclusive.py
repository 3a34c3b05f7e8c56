"""`calibrate_head_merge(threshold=t)` drops a KV group when each of its heads has a kept head within t, and
"within" includes t itself (docs: threshold 0 merges heads with identical maps), both for the KV group's drop and for
the heads that then follow a representative."""

import torch

from hf_paged.cache.head_merge_calibrate import choose_layer_merge


def test_a_distance_equal_to_the_threshold_lets_the_group_drop():
    d = torch.full((4, 4), 0.5).fill_diagonal_(0)
    d[2, 0] = d[0, 2] = d[3, 1] = d[1, 3] = 0.125  # exactly the threshold (exact in binary)
    # KV group 1 dropped: heads 2, 3 follow 0, 1 even though heads of kept groups merge only at distance 0
    assert choose_layer_merge(d, 2, 0.125, score_threshold=0) == (0, 1, 0, 1)
    assert choose_layer_merge(d, 2, 0.1, score_threshold=0) == (0, 1, 2, 3)  # just beyond it: nothing drops
