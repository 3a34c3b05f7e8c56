"""The hf-paged command: generate and bench on a local model directory; bad arguments are one-line errors."""

import json

import pytest

from hf_paged.cli import main
from hf_paged.models import DEFAULT_MODEL_PATH

MODEL = str(DEFAULT_MODEL_PATH)


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


def test_bench_writes_json_result(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["bench", "--model", MODEL, "--workload", "shared-prefix", "--num-prompts", "4",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["workload"] == "shared-prefix" and result["hf_paged"]["tokens_per_s"] > 0
    assert result["hf_paged"]["prefix_hit_rate"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--model", MODEL, "--prompts", "/nonexistent.jsonl"], "prompts file"),
        (["generate", "--model", "/no/such/model", "--prompts", "PROMPTS"], "not found"),
        (["generate", "--model", MODEL, "--prompts", "PROMPTS", "--schema", "/no/schema.json"], "schema file"),
        (["bench", "--model", MODEL, "--workload", "nope"], "unknown workload"),
        (["bench", "--model", "/no/such/model"], "not found"),
        (["generate", "--model", MODEL, "--prompts", "PROMPTS", "--max-new-tokens", "0"], "--max-new-tokens must be"),
        (["bench", "--model", MODEL, "--num-prompts", "0"], "--num-prompts must be"),
        (["serve", "--max-waiting", "0"], "--max-waiting must be >= 1"),
        (["serve", "--shutdown-timeout", "-1"], "--shutdown-timeout"),
        (["serve", "--block-size", "3"], "block_size must be a power of two"),
        (["serve", "--model", "/no/such/model"], "not found"),
        (["serve", "--chat-template", "/no/template.jinja"], "chat template file"),
    ],
)
def test_bad_arguments_give_one_line_and_nonzero_exit(argv, message, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hello"\n')
    assert main([str(prompts) if a == "PROMPTS" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_a_schema_too_deep_to_compile_is_one_line(tmp_path, capsys):
    prompts, schema = tmp_path / "p.jsonl", tmp_path / "s.json"
    prompts.write_text('"hello"\n')
    deep: dict = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    schema.write_text(json.dumps(deep))
    assert main(["generate", "--model", MODEL, "--prompts", str(prompts), "--schema", str(schema)]) == 2
    err = capsys.readouterr().err
    assert "nests deeper than" in err.strip().splitlines()[-1] and "Traceback" not in err


def test_schema_that_does_not_parse(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"x"\n')
    schema = tmp_path / "s.json"
    schema.write_text("{not json")
    assert main(["generate", "--model", MODEL, "--prompts", str(prompts), "--schema", str(schema)]) == 2
    assert "does not parse" in capsys.readouterr().err
