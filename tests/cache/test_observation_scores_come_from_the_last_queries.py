"""SnapKV's observation window is the LAST `num_observed` queries of the prompt (the ones that predict the answer):
`observation_scores` takes those rows of the step's queries, each seeing the keys up to its own position."""

import torch

from hf_paged.cache.pruning import observation_scores


def test_only_the_last_queries_vote_and_each_sees_its_own_prefix():
    keys = torch.eye(4)[:, None, :] * 10.0  # 4 keys, 1 KV head: key k points along dim k
    query = torch.zeros(4, 1, 4)
    query[0, 0, 0] = 10.0  # the first query wants key 0: it is not in the window and must not vote
    query[2, 0, 1] = 10.0  # position 2 wants key 1
    query[3, 0, 3] = 10.0  # position 3 wants key 3 (itself)
    scores = observation_scores(query, keys, 2, 1.0)[0]
    assert scores[3] > 0.99 and scores[1] > 0.99 and scores[0] < 1e-3 and scores[2] < 1e-3
    # position 2 cannot see key 3: with only it voting, key 3 scores 0
    only_2 = observation_scores(query[:3], keys[:3], 1, 1.0)[0]
    assert only_2.shape == (3,) and only_2[1] > 0.99
