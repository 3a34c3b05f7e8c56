"""`PagedGenerationCallback` in a real Trainer run over 2 CPU processes (DDP, gloo, torchrun): each rank generates
its shard, and every rank logs the same numbers, computed once on all prompts."""

from __future__ import annotations

from tests.distributed.cases import callback_prompts
from tests.distributed.launch import run_ranks


def test_trainer_in_ddp_logs_the_same_metrics_on_every_rank(tmp_path):
    ranks = run_ranks("callback", tmp_path)
    assert ranks[0]["world_size"] == 2
    assert ranks[0] == ranks[1]  # tokens, metric values (throughput included) and log history: identical
    got = ranks[0]
    assert len(got["metrics"]) == 2 and len(got["tokens"][0]) == len(callback_prompts())
    # each evaluation equals stock greedy generate on the weights of that moment, on all prompts
    assert all(m["eval_generation_matches_stock"] == 1.0 for m in got["metrics"])
    assert got["tokens"][0] != got["tokens"][1]  # the weights moved between evaluations
    # both ranks generated (two prefix groups, one a rank), and the log holds what the callback computed
    assert all(n > 0 for per_eval in got["generated_by_rank"] for n in per_eval)
    assert got["logged"] == got["metrics"]
    assert got["wrapped_after"] is False
