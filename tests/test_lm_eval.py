"""lm-evaluation-harness on the engine: `PagedLM` (the model `hf-paged`) equal to lm-eval's `hf` backend sample by
sample on the local tasks, lm-eval's own `HFLM` over a wrapped model with no fallback, `hf-paged eval`, bad input."""

from __future__ import annotations

import json
import warnings

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.tasks import TaskManager

import hf_paged
from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.errors import InvalidConfigError
from hf_paged.integrations.lm_eval import PagedLM, _window_budget

TASKS_DIR = str(DEFAULT_MODEL_PATH.parent / "lm_eval_tasks")
TASKS = ["hf_paged_gen", "hf_paged_mc", "hf_paged_ppl"]


def _evaluate(model, limit: int, **kwargs):
    return lm_eval.simple_evaluate(model=model, tasks=TASKS, task_manager=TaskManager(include_path=TASKS_DIR),
                                   limit=limit, device="cpu", log_samples=True, **kwargs)


def _same_responses(ours, theirs) -> None:
    """Generated text identical; log-likelihoods within 1e-4 (relative 1e-6 for a document's sum over thousands of
    tokens: hf sums in fp32, whose rounding alone is ~2e-4 at 3,600) and the same is-greedy flags."""
    for task in TASKS:
        for a, b in zip(ours["samples"][task], theirs["samples"][task], strict=True):
            assert a["doc_id"] == b["doc_id"]
            for x, y in zip(a["resps"], b["resps"], strict=True):
                x, y = x[0], y[0]
                if isinstance(x, str):
                    assert x == y, task
                elif isinstance(x, float):
                    assert x == pytest.approx(y, abs=1e-4, rel=1e-6), task
                else:
                    assert x[0] == pytest.approx(y[0], abs=1e-4) and x[1] == y[1], task


@pytest.fixture(scope="module")
def reference():
    """lm-eval's `hf` backend at batch 4 on the embedded model."""
    return _evaluate("hf", 3, model_args=f"pretrained={DEFAULT_MODEL_PATH},dtype=float32", batch_size=4)


def test_paged_lm_equals_the_hf_backend_sample_by_sample(reference):
    ours = _evaluate("hf-paged", 3, model_args=f"pretrained={DEFAULT_MODEL_PATH},dtype=float32,block_size=16")
    _same_responses(ours, reference)
    for task in TASKS:
        theirs, mine = reference["results"][task], ours["results"][task]
        metrics = [k for k, v in theirs.items() if "," in k and "stderr" not in k and isinstance(v, float)]
        assert metrics and [mine[k] for k in metrics] == pytest.approx([theirs[k] for k in metrics], rel=1e-5)


def test_lm_evals_own_hflm_over_a_wrapped_model_runs_on_the_engine(reference):
    from lm_eval.models.huggingface import HFLM

    default = hf_paged.default_model()
    model = hf_paged.wrap(default.model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hf_paged.PagedFallbackWarning)
        ours = _evaluate(HFLM(pretrained=model, tokenizer=default.tokenizer, batch_size=4), 3)
    assert hf_paged.engine_of(model).metrics.num_steps > 0
    _same_responses(ours, reference)


def test_unknown_model_args_are_named():
    with pytest.raises(InvalidConfigError, match=r"unknown model argument\(s\) \['blok_size'\]"):
        PagedLM(pretrained=str(DEFAULT_MODEL_PATH), blok_size=16)
    with pytest.raises(ValueError, match="block_size"):
        PagedLM(pretrained=str(DEFAULT_MODEL_PATH), block_size=-1)


def test_the_step_budget_holds_a_window_unless_given():
    """A rolling window of max_length tokens runs in one step (up to 4x the default budget); a given budget stays."""
    def budget(**kwargs) -> int:
        lm = PagedLM(pretrained=str(DEFAULT_MODEL_PATH), device="cpu", dtype="float32", **kwargs)
        return hf_paged.engine_of(lm.model).config.max_num_batched_tokens

    assert budget() == 2048  # the embedded model's positions
    assert budget(max_num_batched_tokens=256) == 256
    assert _window_budget(1024, 10**5) == 4096  # at most 4x the default (a max_length past the positions is refused)
    assert budget(max_length=64) == 1024  # never below the default


def test_a_context_longer_than_the_model_is_cut_as_hf_cuts_it():
    """lm-eval's hf keeps the last max_length + 1 tokens of context + continuation; so does PagedLM."""
    from lm_eval.models.huggingface import HFLM

    theirs = HFLM(pretrained=str(DEFAULT_MODEL_PATH), max_length=64, device="cpu", dtype="float32")
    ours = PagedLM(pretrained=str(DEFAULT_MODEL_PATH), max_length=64, device="cpu", dtype="float32")
    request = (("ctx", "cont"), list(range(3, 103)), [40, 41, 42])
    (a,), (b,) = ours._loglikelihood_tokens([request]), theirs._loglikelihood_tokens([request])
    assert a[0] == pytest.approx(b[0], abs=1e-4) and a[1] == b[1]


def test_hf_paged_eval_runs_lm_eval_with_this_model(tmp_path, capsys):
    from hf_paged.cli import main

    code = main(["eval", "--tasks", "hf_paged_mc", "--limit", "2", "--batch_size", "8", "--output_path",
                 str(tmp_path), "--model_args", f"pretrained={DEFAULT_MODEL_PATH},dtype=float32"])
    assert code == 0
    assert "--batch_size is unused" in capsys.readouterr().err
    (result,) = tmp_path.rglob("results_*.json")
    data = json.loads(result.read_text())
    assert data["config"]["model"] == "hf-paged" and "acc,none" in data["results"]["hf_paged_mc"]


def test_model_args_without_a_model_take_the_embedded_one():
    """`--model_args block_size=32` alone was refused ("needs pretrained=PATH") where no --model_args runs the
    embedded model: both run it now, with the arguments given."""
    from lm_eval._cli import HarnessCLI

    from hf_paged.cli.eval import parse_arguments

    def model_args(*argv):
        return parse_arguments(HarnessCLI(), list(argv)).model_args

    embedded = {"pretrained": str(DEFAULT_MODEL_PATH), "dtype": "float32"}
    assert model_args() == embedded
    assert model_args("--model_args", "block_size=32") == {**embedded, "block_size": 32}
    assert model_args("--model_args", "dtype=bfloat16,bogus=1") == {**embedded, "dtype": "bfloat16", "bogus": 1}
    assert model_args("--model_args", "pretrained=/m,block_size=8") == {"pretrained": "/m", "block_size": 8}


def test_hf_paged_eval_refuses_another_backend(capsys):
    from hf_paged.cli import main

    assert main(["eval", "--model", "vllm", "--tasks", "hf_paged_mc"]) == 2
    assert "not --model vllm" in capsys.readouterr().err
    assert main(["eval", "--tasks", "no_such_task", "--limit", "1"]) == 2
    assert "Tasks not found: no_such_task" in capsys.readouterr().err
    assert main(["eval", "--help"]) == 0
    assert "hf-paged eval" in capsys.readouterr().out
