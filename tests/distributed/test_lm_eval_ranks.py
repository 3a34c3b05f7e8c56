"""lm-eval with `hf-paged` over 2 gloo ranks (torchrun): each rank evaluates its share of the requests, and rank 0
reports the numbers one process gives, sample by sample."""

from __future__ import annotations

import pytest

from tests.distributed.launch import run_ranks
from tests.distributed.workers import lm_eval_task_manager

lm_eval = pytest.importorskip("lm_eval")

TASKS, LIMIT = "hf_paged_gen,hf_paged_mc", 4


def _one_process() -> dict:
    import hf_paged.integrations.lm_eval  # noqa: F401 -- registers hf-paged
    from hf_paged.api.models import DEFAULT_MODEL_PATH

    out = lm_eval.simple_evaluate(
        model="hf-paged", model_args=f"pretrained={DEFAULT_MODEL_PATH},dtype=float32", tasks=TASKS.split(","),
        task_manager=lm_eval_task_manager(), limit=LIMIT,
        device="cpu", log_samples=True)
    return {"results": {t: {k: v for k, v in r.items() if "," in k} for t, r in out["results"].items()},
            "resps": {t: {str(s["doc_id"]): s["resps"] for s in samples} for t, samples in out["samples"].items()}}


def _flat(value) -> list:
    """A sample's responses as one flat list (JSON made its tuples lists; text and flags compare exactly)."""
    if isinstance(value, list | tuple):
        return [x for item in value for x in _flat(item)]
    return [value]


def test_two_ranks_report_what_one_process_does(tmp_path):
    ranks = run_ranks("lm_eval_ranks", tmp_path, TASKS, str(LIMIT), timeout=240)
    assert ranks[0]["world_size"] == 2 and ranks[1]["results"] is None  # rank 0 reports
    single = _one_process()
    assert ranks[0]["resps"].keys() == single["resps"].keys()
    for task, by_doc in single["resps"].items():
        assert ranks[0]["resps"][task].keys() == by_doc.keys()  # every document once, on some rank
        for doc, resps in by_doc.items():
            assert _flat(ranks[0]["resps"][task][doc]) == pytest.approx(_flat(resps), abs=1e-4), (task, doc)
    for task, metrics in single["results"].items():
        got = ranks[0]["results"][task]
        assert {k: v for k, v in got.items() if "stderr" not in k} == pytest.approx(
            {k: v for k, v in metrics.items() if "stderr" not in k}, rel=1e-5)
