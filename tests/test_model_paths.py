"""A model path that is not there is named in one line (the commands, `PagedLM`); a hub id, one word ("gpt2") or
"org/name", is left to `from_pretrained` (it was refused as "not found" when it had no "/")."""

from __future__ import annotations

import pytest

from hf_paged.api.loading import load_model, missing_model_path
from hf_paged.errors import CliError, InvalidConfigError


def test_missing_model_path(tmp_path):
    assert missing_model_path(str(tmp_path / "nope")) and missing_model_path("./nope") and missing_model_path("~/nope")
    assert missing_model_path("models/org/name")  # more than one "/": a path, not a hub id
    assert not missing_model_path(str(tmp_path))  # there (whether it holds a model is from_pretrained's to say)
    assert not missing_model_path("gpt2") and not missing_model_path("Qwen/Qwen2.5-0.5B")  # hub ids


def test_load_model_names_a_missing_directory(tmp_path):
    with pytest.raises(CliError, match="not found: give a model directory or a hub id"):
        load_model(str(tmp_path / "nope"))


def test_paged_lm_without_a_model_or_with_a_missing_one():
    pytest.importorskip("lm_eval")
    from hf_paged.integrations.lm_eval import PagedLM

    with pytest.raises(InvalidConfigError, match="pretrained=PATH"):
        PagedLM(block_size=16)  # `--model_args block_size=16`: no model named
    with pytest.raises(InvalidConfigError, match="'/nonexistent/model' not found"):
        PagedLM(pretrained="/nonexistent/model")
