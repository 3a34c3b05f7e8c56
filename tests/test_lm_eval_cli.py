"""`hf-paged eval`'s arguments: repeated `--model_args` merge as `lm-eval run` merges them (the model named in the
first is the one evaluated), the embedded model is announced when none is named, options without a value and bad
model arguments end in one `hf-paged: error:` line with exit 2, never a traceback or another model."""

from __future__ import annotations

import json
import re
import shutil

import pytest

lm_eval = pytest.importorskip("lm_eval")

import torch
from lm_eval._cli import HarnessCLI

from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.cli import main
from hf_paged.cli.eval import parse_arguments

MODEL = str(DEFAULT_MODEL_PATH)


def _model_args(*argv: str) -> dict:
    return parse_arguments(HarnessCLI(), list(argv)).model_args


def test_repeated_model_args_merge_later_keys_winning(capsys):
    """`--model_args pretrained=P --model_args dtype=float32` evaluated the embedded model (the last value alone
    was kept), exit 0."""
    assert _model_args("--model_args", "pretrained=/m,block_size=8", "--model_args", "dtype=float32",
                       "--model_args", "block_size=32") == {"pretrained": "/m", "block_size": 32, "dtype": "float32"}
    assert _model_args("--model_args", "pretrained=/m", "dtype=float16") == {"pretrained": "/m", "dtype": "float16"}
    assert _model_args("--model_args", "pretrained=/m, dtype=float32") == {"pretrained": "/m", "dtype": "float32"}
    assert "embedded" not in capsys.readouterr().err
    assert _model_args("--model_args", "block_size=32")["pretrained"] == MODEL
    assert "no pretrained= in --model_args: evaluating the embedded tiny model" in capsys.readouterr().err


def test_a_device_in_the_model_arguments_is_the_one_device(capsys):
    """`--model_args device=cpu` ended in a TypeError traceback (PagedLM got `device` twice): the `--device` this
    command adds when none is given went beside it. Given both ways, it is refused by name."""
    args = parse_arguments(HarnessCLI(), ["--model_args", "device=cpu", "--tasks", "hf_paged_mc"])
    assert "device" not in args.model_args and args.device == "cpu"  # passed once, as lm-eval passes --device
    assert main(["eval", "--model_args", "device=cpu", "--device", "cpu", "--tasks", "hf_paged_mc"]) == 2
    assert "device is given twice, as device= in --model_args and as --device" in capsys.readouterr().err
    # batch_size= there (a TypeError the same way): unused, as --batch_size is
    args = parse_arguments(HarnessCLI(), ["--model_args", "batch_size=8,block_size=8", "--tasks", "hf_paged_mc"])
    assert args.model_args == {"pretrained": MODEL, "dtype": "float32", "block_size": 8}
    assert "batch_size= in --model_args is unused" in capsys.readouterr().err


def test_the_model_named_in_the_first_model_args_is_the_one_evaluated(tmp_path, capsys):
    mine = tmp_path / "my-model"
    shutil.copytree(DEFAULT_MODEL_PATH, mine)
    code = main(["eval", "--tasks", "hf_paged_mc", "--limit", "1", "--model_args", f"pretrained={mine}",
                 "--model_args", "dtype=float32,block_size=32", "--output_path", str(tmp_path / "out")])
    assert code == 0 and "embedded" not in capsys.readouterr().err
    (result,) = (tmp_path / "out").rglob("results_*.json")
    data = json.loads(result.read_text())
    assert data["model_name"] == str(mine)
    assert data["config"]["model_args"] == {"pretrained": str(mine), "dtype": "float32", "block_size": 32}


@pytest.mark.parametrize(("argv", "message"), [
    (["--tasks", "hf_paged_mc", "--model"], "--model needs a value"),
    (["--model", "--tasks", "hf_paged_mc"], "--model needs a value"),
    (["--batch_size", "--tasks", "hf_paged_mc"], "--batch_size needs a value"),
    (["--batch_size=", "--tasks", "hf_paged_mc"], "--batch_size= needs a value"),
])
def test_an_option_without_its_value_is_refused(argv, message, capsys):
    """`--batch_size --include_path DIR` took `--include_path` as the batch size and left DIR behind."""
    assert main(["eval", *argv]) == 2
    assert f"hf-paged: error: {message}" in capsys.readouterr().err


def _no_task_index(monkeypatch) -> None:
    """A TaskManager built from here on fails the test: the arguments must be refused before it."""
    from lm_eval.tasks import TaskManager

    def refuse(*args, **kwargs):
        raise AssertionError("lm-eval built its TaskManager before the bad argument was refused")

    monkeypatch.setattr(TaskManager, "__init__", refuse)


@pytest.mark.parametrize(("model_args", "message"), [
    ("num_blocks=-1", r"PagedConfig.num_blocks must be >= 1, got -1"),  # lm-eval's CLI reads -1 as the float -1.0
    ("num_blocks=2.5", r"model argument num_blocks=2.5: an integer is wanted"),
    ("block_size=abc", r"model argument block_size='abc': an integer is wanted \(e.g. block_size=16\)"),
    ("dtype=bogus", r"model argument dtype='bogus' is not a torch dtype: use float32"),
    ("max_length=abc", r"model argument max_length='abc': a positive integer is wanted"),  # a TypeError traceback
    ("max_length=-5", r"model argument max_length=-5: a positive integer is wanted"),  # refused at the first request
    # a TypeError traceback inside the tokenizer at the first request, exit 1:
    ("prefix_token_id=-1", r"model argument prefix_token_id=-1: a token id is wanted, an integer >= 0"),
    ("prefix_token_id=1.5", r"model argument prefix_token_id=1.5: a token id is wanted"),
    ("prefix_token_id=abc", r"model argument prefix_token_id='abc': a token id is wanted"),
    ("add_bos_token=maybe", r"model argument add_bos_token='maybe': True or False is wanted"),
])
def test_bad_model_arguments_end_in_one_line_and_exit_2(model_args, message, capsys, monkeypatch):
    _no_task_index(monkeypatch)  # refused before lm-eval indexes its ~15k task files (~10 s)
    argv = ["--tasks", "hf_paged_mc", "--limit", "1", "--model_args", f"pretrained={MODEL},{model_args}"]
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("hf-paged: error:")]
    assert re.search(message, line)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a torch without CUDA")
def test_device_cuda_without_cuda_is_refused_by_name(capsys, monkeypatch):
    _no_task_index(monkeypatch)
    assert main(["eval", "--tasks", "hf_paged_mc", "--limit", "1", "--device", "cuda"]) == 2
    assert "hf-paged: error: device 'cuda', but this torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "message"), [
    ("--output_path={file}/sub", r"--output_path '.*/afile/sub': '.*/afile' is a file, not a folder"),
    ("--output_path={file}/deeper/results.json", r"'.*/afile' is a file, not a folder"),
    ("--output_path={file}", r"--output_path '.*/afile': '.*/afile' is a file, not a folder"),
    ("--include_path={missing}", r"--include_path '.*/missing' does not exist: give the folder of your task files"),
])
def test_a_path_that_cannot_be_used_is_refused_before_the_run(option, message, tmp_path, capsys, monkeypatch):
    """`--output_path afile/sub` ran the whole evaluation, then logged "Could not save results aggregated" and exited
    0; `--include_path /nonexistent` was taken silently."""
    (tmp_path / "afile").write_text("x")
    _no_task_index(monkeypatch)
    option = option.format(file=tmp_path / "afile", missing=tmp_path / "missing")
    assert main(["eval", "--tasks", "hf_paged_mc", "--limit", "1", option]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-paged: error:")]
    assert re.search(message, line)


def test_an_output_path_to_be_made_is_taken(tmp_path):
    from hf_paged.cli.eval import _check_output_path

    _check_output_path(str(tmp_path / "new" / "deeper"))  # lm-eval makes it, parents included
    _check_output_path(str(tmp_path / "new" / "results.json"))
    _check_output_path("relative-folder")


@pytest.mark.parametrize(("argv", "message"), [
    (["--limit", "-1"], "--limit must be > 0, got -1"),  # lm-eval's own message, after the model was loaded
    (["--limit", "0"], "--limit must be > 0, got 0"),
    (["--num_fewshot", "-1"], "--num_fewshot must be >= 0, got -1"),  # taken silently
])
def test_a_count_out_of_range_is_refused_before_the_model_loads(argv, message, capsys, monkeypatch):
    _no_task_index(monkeypatch)
    assert main(["eval", "--tasks", "hf_paged_mc", *argv]) == 2
    assert f"hf-paged: error: {message}" in capsys.readouterr().err


def test_a_fraction_of_a_task_is_still_a_limit():
    from hf_paged.cli.eval import _check_run_arguments

    args = parse_arguments(HarnessCLI(), ["--tasks", "hf_paged_mc", "--limit", "0.5", "--num_fewshot", "0"])
    _check_run_arguments(args)
    assert args.limit == 0.5 and args.num_fewshot == 0
