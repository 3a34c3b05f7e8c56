"""The hf-paged command: generate and bench (on the embedded model when --model is absent); every user error of
every subcommand is one line on stderr and exit status 2, never a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.cli import main

MODEL = str(DEFAULT_MODEL_PATH)
REPO = Path(__file__).resolve().parents[1]


def nested_schema_text(depth: int) -> str:
    """An object schema nested `depth` levels deep, as text (json.dumps itself recurses on deep documents)."""
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "integer"}' + "}}" * depth


@pytest.fixture()
def files(tmp_path):
    """Input files the bad-argument cases refer to by name."""
    paths = {
        "PROMPTS": tmp_path / "p.jsonl", "NOT_JSONL": tmp_path / "bad.jsonl", "LATIN1": tmp_path / "latin1.jsonl",
        "BAD_JSON": tmp_path / "bad.json", "NOT_A_SCHEMA": tmp_path / "type5.json",
        "DEEP_500": tmp_path / "deep500.json", "DEEP_2000": tmp_path / "deep2000.json", "DIR": tmp_path,
        "SURROGATE": tmp_path / "surrogate.jsonl",
    }
    paths["PROMPTS"].write_text('"hello"\n')
    paths["NOT_JSONL"].write_text("hello\n")
    paths["LATIN1"].write_bytes('"caf\u00e9"\n'.encode("latin-1"))
    paths["SURROGATE"].write_text('{"prompt": "a\\ud800"}\n')  # valid JSON, no Unicode text (a traceback before)
    paths["BAD_JSON"].write_text("{not json")
    paths["NOT_A_SCHEMA"].write_text('{"type": 5}')
    paths["DEEP_500"].write_text(nested_schema_text(500))
    paths["DEEP_2000"].write_text(nested_schema_text(2000))
    return {name: str(path) for name, path in paths.items()}


@pytest.fixture()
def quiet_loading(monkeypatch):
    """No "Loading weights" progress bar on stderr (it is transformers' output, not ours)."""
    monkeypatch.setattr(transformers.utils.logging, "_tqdm_active", False)


def assert_one_line_error(err: str, message: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hf-paged: error: ") and message in lines[0], lines[0]


def test_generate_writes_one_json_line_per_prompt(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n" + json.dumps("import os") + "\n")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                                        "maximum": 9}}, "required": ["n"]}))
    assert main(["generate", "--model", MODEL, "--prompts", str(prompts), "--schema", str(schema),
                 "--max-new-tokens", "24"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt"] for line in lines] == ["def add(a, b):", "import os"]
    for line in lines:
        assert set(line) >= {"text", "tokens", "finish_reason", "valid"}
        if line["finish_reason"] == "stop":
            assert line["valid"] is True


def test_generate_and_bench_default_to_the_embedded_model(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"def main():"\n')
    assert main(["generate", "--prompts", str(prompts), "--max-new-tokens", "4"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert len(line["tokens"]) == 4 and line["finish_reason"] == "length"
    out = tmp_path / "result.json"
    assert main(["bench", "--workload", "shared-prefix", "--num-prompts", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == MODEL and result["workload"] == "shared-prefix"
    assert result["hf_paged"]["tokens_per_s"] > 0 and result["hf_paged"]["prefix_hit_rate"] > 0


@pytest.mark.parametrize("command", ["bench", "generate"])
def test_help_says_the_model_defaults_to_the_embedded_one(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert "default: the embedded tiny model" in " ".join(capsys.readouterr().out.split())


BAD_ARGUMENTS = [
    # the command itself
    ([], "arguments are required: command"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["--bogus"], "arguments are required: command"),
    (["demo", "--bogus"], "unrecognized arguments: --bogus"),
    # bench
    (["bench", "--model", "/no/such/model"], "model '/no/such/model' not found"),
    (["bench", "--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (["bench", "--num-prompts", "-1"], "--num-prompts must be >= 1, got -1"),
    (["bench", "--num-prompts", "x"], "argument --num-prompts: invalid int value: 'x'"),
    (["bench", "--workload", "nope"], "unknown workload 'nope'"),
    (["bench", "--dtype", "float8"], "argument --dtype: invalid choice"),
    (["bench", "--out", "/no/such/folder/r.json"], "folder '/no/such/folder' does not exist"),
    (["bench", "--out", "DIR"], "is a directory"),
    (["bench", "--plot", "/no/such/folder/r.png"], "--plot '/no/such/folder/r.png'"),
    (["bench", "--bogus"], "unrecognized arguments: --bogus"),
    # generate
    (["generate"], "arguments are required: --prompts"),
    (["generate", "--model", "/no/such/model", "--prompts", "PROMPTS"], "model '/no/such/model' not found"),
    (["generate", "--model", "DIR", "--prompts", "PROMPTS"], "cannot load model"),
    (["generate", "--prompts", "PROMPTS", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["generate", "--prompts", "PROMPTS", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 1, got -1"),
    (["generate", "--prompts", "PROMPTS", "--max-new-tokens", "1.5"], "invalid int value: '1.5'"),
    (["generate", "--prompts", "/no/prompts.jsonl"], "prompts file '/no/prompts.jsonl' not found"),
    (["generate", "--prompts", "DIR"], "is a directory, not a file"),  # (it said "not found")
    (["generate", "--prompts", "NOT_JSONL"], ":1: not JSON"),
    (["generate", "--prompts", "LATIN1"], "is not UTF-8 text"),
    (["generate", "--prompts", "SURROGATE"], ":1: the prompt holds a lone UTF-16 surrogate"),
    (["generate", "--prompts", "PROMPTS", "--schema", "/no/schema.json"], "schema file '/no/schema.json' not found"),
    (["generate", "--prompts", "PROMPTS", "--schema", "DIR"], "is a directory, not a file"),
    (["generate", "--prompts", "PROMPTS", "--schema", "BAD_JSON"], "does not parse as JSON"),
    (["generate", "--prompts", "PROMPTS", "--schema", "NOT_A_SCHEMA"], "not a valid JSON Schema"),
    (["generate", "--prompts", "PROMPTS", "--schema", "DEEP_500"], "nests deeper than 64 JSON levels"),
    (["generate", "--prompts", "PROMPTS", "--schema", "DEEP_2000"], "nests deeper than 64 JSON levels"),
    (["generate", "--prompts", "PROMPTS", "--device", "tpu"], "argument --device: invalid choice"),
    (["generate", "--prompts", "PROMPTS", "--bogus"], "unrecognized arguments: --bogus"),
    # serve: every case fails on validation before a socket is bound
    (["serve", "--max-waiting", "-1"], "--max-waiting must be >= 0 (0: no bound), got -1"),
    (["serve", "--shutdown-timeout", "-1"], "--shutdown-timeout must be >= 0"),
    (["serve", "--max-request-bytes", "10"], "--max-request-bytes must be >= 1024"),
    (["serve", "--replicas", "2", "--max-request-bytes", "4096"], "--max-request-bytes is for one server"),
    (["serve", "--block-size", "3"], "block_size must be a power of two"),
    (["serve", "--num-blocks", "0"], "num_blocks must be >= 1"),
    (["serve", "--max-num-seqs", "-1"], "max_num_seqs must be >= 1"),
    (["serve", "--port", "70000"], "--port must be between 0 and 65535"),
    (["serve", "--port", "x"], "argument --port: invalid int value"),
    (["serve", "--model", "/no/such/model"], "not found"),
    (["serve", "--chat-template", "/no/template.jinja"], "chat template file"),
    (["serve", "--max-cache-bytes", str(10**15)], "max_cache_bytes=1000000000000000 asks for"),  # loads the model
    (["serve", "--kv-cache-dtype", "int2"], "argument --kv-cache-dtype: invalid choice"),
    (["serve", "--bogus"], "unrecognized arguments: --bogus"),
]
if not torch.cuda.is_available():
    BAD_ARGUMENTS.append((["serve", "--device", "cuda"], "no CUDA device is available"))
    BAD_ARGUMENTS.append((["generate", "--prompts", "PROMPTS", "--device", "cuda"], "no CUDA device is available"))


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS, ids=[" ".join(a) or "(none)" for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_give_one_line_and_exit_status_2(argv, message, files, quiet_loading, capsys):
    assert main([files.get(a, a) for a in argv]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.err, message)
    assert captured.out == ""


@pytest.mark.parametrize("module", ["hf_paged.cli", "hf_paged"])
def test_a_real_process_prints_one_line_without_traceback(module):
    """`python -m hf_paged.cli` and `python -m hf_paged` (the module run as `__main__`): a `CliError` raised in a
    helper (`cli_bench`) is still the class `main` catches."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    run = subprocess.run([sys.executable, "-m", module, "bench", "--model", "/no/such/model"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2, run.stderr
    assert_one_line_error(run.stderr, "model '/no/such/model' not found")
