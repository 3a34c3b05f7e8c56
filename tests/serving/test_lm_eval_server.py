"""lm-evaluation-harness's `local-completions` model against `hf-paged serve`: its loglikelihood requests (`echo:
true, max_tokens: 1, logprobs: 1, temperature: 0` over token prompts) give, sample by sample, the log-likelihoods
and is-greedy flags of lm-eval's own `hf` backend on the local multiple-choice task."""

from __future__ import annotations

import pytest

lm_eval = pytest.importorskip("lm_eval")
for _name in ("aiohttp", "requests", "tenacity"):  # lm-eval's API models need its [api] extra
    pytest.importorskip(_name)

from lm_eval.tasks import TaskManager

from hf_paged.api.models import DEFAULT_MODEL_PATH

TASKS_DIR = str(DEFAULT_MODEL_PATH.parent / "lm_eval_tasks")
TASK = "hf_paged_mc"
LIMIT = 3


def _evaluate(model: str, model_args: str, **kwargs):
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[TASK], limit=LIMIT,
                                   task_manager=TaskManager(include_path=TASKS_DIR), log_samples=True, **kwargs)


def test_local_completions_scores_like_the_hf_backend(server):
    # add_bos_token: the hf backend tokenizes with the tokenizer's BOS, local-completions only when told to
    ours = _evaluate("local-completions", f"model=tiny-lm,base_url={server.url}/v1/completions,"
                     f"tokenizer={DEFAULT_MODEL_PATH},tokenizer_backend=huggingface,tokenized_requests=True,"
                     "add_bos_token=True,num_concurrent=1,max_retries=1,batch_size=4")
    theirs = _evaluate("hf", f"pretrained={DEFAULT_MODEL_PATH},dtype=float32", batch_size=4, device="cpu")
    a_samples, b_samples = ours["samples"][TASK], theirs["samples"][TASK]
    assert len(a_samples) == len(b_samples) == LIMIT
    for a, b in zip(a_samples, b_samples, strict=True):
        assert a["doc_id"] == b["doc_id"]
        for (x,), (y,) in zip(a["resps"], b["resps"], strict=True):
            assert x[0] == pytest.approx(y[0], abs=1e-4) and x[1] == y[1]
    assert ours["results"][TASK]["acc,none"] == theirs["results"][TASK]["acc,none"]
