"""Every ```python block of README.md runs as written, in order, in one namespace (the README says the snippets
continue each other), with the model path swapped for the embedded model; the constrained one yields valid JSON.
The blocks that talk to `hf-paged serve` (the curl command, the OpenAI client, `hp.remote`) run against a real
server on 127.0.0.1 over the embedded model, served under the README's model name."""

from __future__ import annotations

import contextlib
import io
import json
import re
import urllib.request
from pathlib import Path

import jsonschema
import pytest

import hf_paged
from hf_paged.api.models import DEFAULT_MODEL_PATH

README = Path(__file__).resolve().parents[1] / "README.md"
# Blocks not run in order, by their first line, and why. Only what needs a GPU or a server belongs here.
SKIPPED = {
    "from openai import OpenAI": "a client of a running `hf-paged serve`: test_the_server_snippets",
    'server = hp.remote("http://127.0.0.1:8000", timeout=120)': "a running `hf-paged serve`: test_the_server_snippets",
}
README_URL = "http://127.0.0.1:8000"  # where the README's server snippets find `hf-paged serve`
# `path = "..."` names the user's model (a hub id): the embedded model stands in for it, offline.
_PATH_LINE = re.compile(r'^path = "[^"\n]*"', re.MULTILINE)
FINISH_REASONS = ("stop", "length", "length_incomplete", "stop_incomplete", "scored", "abort", "error")  # every value the engine sets


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def first_line(block: str) -> str:
    """A block's first statement, without its comment: the key of `SKIPPED` and of the printed outputs."""
    return block.strip().splitlines()[0].split("#")[0].strip()


@pytest.fixture(scope="module")
def readme():
    return README.read_text()


@pytest.fixture(scope="module")
def ran(readme):
    """(namespace, {first line: printed output}) after running every block that is not skipped."""
    namespace: dict = {"__name__": "readme"}
    printed = {}
    blocks = [b for b in python_blocks(readme) if first_line(b) not in SKIPPED]
    try:
        for block in blocks:
            code, swaps = _PATH_LINE.subn(f"path = {str(DEFAULT_MODEL_PATH)!r}", block)
            assert swaps <= 1
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    exec(compile(code, f"README.md block {first_line(block)!r}", "exec"), namespace)
                except Exception as exc:
                    raise AssertionError(f"README block starting {first_line(block)!r} failed: {exc!r}") from exc
            printed[first_line(block)] = out.getvalue()
        yield namespace, printed
    finally:
        if "model" in namespace:
            hf_paged.unwrap(namespace["model"])  # stops the engine loop's thread


def test_every_python_block_runs(readme, ran):
    namespace, printed = ran
    firsts = [first_line(b) for b in python_blocks(readme)]
    assert sorted(set(firsts) & set(SKIPPED)) == sorted(SKIPPED)  # the skip list names real blocks only
    assert len(printed) == len(firsts) - len(SKIPPED) >= 5
    assert sum(bool(_PATH_LINE.search(b)) for b in python_blocks(readme)) == 1  # the one model path, swapped
    assert str(namespace["model"].name_or_path) == str(DEFAULT_MODEL_PATH)
    status, reason = printed["import hf_paged"].split()
    assert status == "FINISHED" and reason in ("stop", "length")  # the status prints its name


def test_the_constrained_snippet_yields_valid_json(ran):
    namespace, printed = ran
    schema, docs = namespace["schema"], namespace["docs"]
    assert len(docs) == 2
    for doc in docs:
        jsonschema.validate(doc, schema)
    person, answer, month = namespace["outs"].values()
    assert [o.finish_reason for o in (person, answer, month)] == ["stop"] * 3
    decode = namespace["tokenizer"].decode
    jsonschema.validate(json.loads(decode(person.generated_tokens, skip_special_tokens=True)), schema)
    assert decode(answer.generated_tokens, skip_special_tokens=True) in ("yes", "no")
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}", decode(month.generated_tokens, skip_special_tokens=True))


def test_the_engine_and_async_snippets_end_as_they_say(ran):
    namespace, printed = ran
    assert namespace["output"].finish_reason in ("stop", "length")
    assert printed[next(k for k in printed if k.startswith("engine = "))].splitlines()[-1] == "abort"
    deltas = printed["import asyncio"].splitlines()
    assert deltas and deltas[-1].endswith("True") and all(d.endswith("False") for d in deltas[:-1])


def test_the_readme_says_what_a_new_user_needs(readme):
    first_commands = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first_commands[0].startswith("pip install torch==2.13.0 -e . && hf-paged demo ")
    assert first_commands[1].startswith('pip install torch==2.13.0 -e ".[test]" && python -m pytest -q ')
    assert "hf_paged.default_model()" in readme
    table = readme[readme.index("| `finish_reason` |"):]
    rows = re.findall(r'^\| `"([a-z_]+)"` \|', table, re.MULTILINE)
    assert rows == list(FINISH_REASONS)


def _server_block(readme: str, starts: str) -> str:
    blocks = [b for b in re.findall(r"^```(?:python|bash)\n(.*?)^```", readme, re.DOTALL | re.MULTILINE) if starts in b]
    assert len(blocks) == 1, f"one README block holds {starts!r}"
    return blocks[0]


def test_the_server_snippets_run_against_a_local_server(readme, ran):
    """The curl command, the OpenAI client and `hp.remote`, as written, against the embedded model served as
    `hf-paged serve` serves it (name `hf-paged/tiny-lm`); `hp.remote` gives the in-process program's fields."""
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    import torch

    from hf_paged import Engine, PagedConfig
    from hf_paged.serving import ServerSettings, build_app
    from tests.serving.conftest import ServerThread, wait_idle

    namespace, _ = ran
    served, served_tokenizer = hf_paged.default_model()
    engine = Engine(served, PagedConfig(block_size=16))
    with ServerThread(build_app(engine, served_tokenizer, ServerSettings(model_name="hf-paged/tiny-lm"))) as server:
        curl = _server_block(readme, "curl " + README_URL)
        path = re.search(r"curl " + re.escape(README_URL) + r"(\S+)", curl).group(1)
        body = re.search(r"-d '([^']*)'", curl).group(1)
        request = urllib.request.Request(server.url + path, data=body.encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        assert answer["model"] == json.loads(body)["model"]
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
        with urllib.request.urlopen(server.url + "/metrics", timeout=60) as response:
            families = set(re.findall(r"^# HELP hf_paged:(\w+) ", response.read().decode(), re.MULTILINE))
        undocumented = {f for f in families if not f.endswith("_created") and f not in readme
                        and f.removesuffix("_total") not in readme}
        assert not undocumented, f"metrics the README does not name: {sorted(undocumented)}"

        torch.manual_seed(0)  # the chat request samples (OpenAI's default temperature 1) from the global generator
        client = _server_block(readme, "from openai import OpenAI").replace(README_URL, server.url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = compile(client, "README.md block 'from openai import OpenAI'", "exec")
            exec(code, dict(namespace))  # noqa: S102 (the README's code)
        jsonschema.validate(json.loads(out.getvalue()), namespace["schema"])  # the streamed text is one document

        remote = _server_block(readme, f'hp.remote("{README_URL}"').replace(README_URL, server.url)
        scope = dict(namespace)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = compile(remote, "README.md block 'server = hp.remote(...)'", "exec")
            exec(code, scope)  # noqa: S102 (the README's code)
        local, over_http = namespace["state"], scope["state"]
        assert over_http["intent"] == local["intent"] and over_http["option"] == local["option"]  # greedy: equal
        assert json.loads(scope["filled"].text)["intent"] in ("billing", "other")
        assert out.getvalue().split() == [over_http["intent"], json.loads(scope["filled"].text)["intent"]]
        wait_idle(engine)


def test_the_first_command_prints_what_the_readme_says(readme):
    """`hf-paged demo`, the README's first command (~7 s of CPU): its table's clock-free figures, 22/22 outputs
    identical to stock, 8/8 JSON valid on both sides, and the hit rate and KV share the README quotes."""
    from hf_paged.cli.demo import run_demo

    table = run_demo(progress=False)
    row = readme[readme.index("| `hf-paged demo` |"):].split("\n", 1)[0]
    hit_rate, kv_share = re.search(r"(\d+)% hit rate, (\d+)% of dense KV bytes, 8/8 JSON valid, 22/22", row).groups()
    assert re.search(r"\| outputs identical to stock +\| +- \| +22/22 \|", table), table
    assert re.search(r"\| JSON outputs valid +\| +8/8 schema-valid \| +8/8 schema-valid \|", table), table
    assert re.search(rf"\| prefix-cache hit rate +\| +- \| +{hit_rate}% \|", table), table
    assert re.search(rf"\| KV bytes vs dense +\| +100% \| +{kv_share}% \|", table), table


def test_the_serve_flags_the_readme_names_exist_and_every_one_is_named(readme):
    """Every `--flag` on a README line of `hf-paged serve` (and its `# also:` list) is one of serve's options, and
    every option of serve is named somewhere in the README."""
    import argparse

    from hf_paged.cli.commands import build_parser

    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    options = {o for a in subcommands["serve"]._actions for o in a.option_strings}
    lines = [line for line in readme.splitlines() if "hf-paged serve" in line and "transformers serve" not in line]
    lines.append(re.search(r"^# also: (.*?)^```", readme, re.DOTALL | re.MULTILINE).group(1))
    named = {flag for line in lines for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", line)}
    assert named <= options, f"not options of hf-paged serve: {sorted(named - options)}"
    unnamed = {o for o in options if o.startswith("--") and o not in readme}
    assert not unnamed, f"options of hf-paged serve the README does not name: {sorted(unnamed)}"


def test_every_setting_is_named_in_the_readme(readme):
    """Each `PagedConfig` and `SamplingParams` field is a knob a user may need: the README names every one."""
    import dataclasses

    for cls in (hf_paged.PagedConfig, hf_paged.SamplingParams):
        unnamed = [f.name for f in dataclasses.fields(cls) if not re.search(rf"\b{f.name}\b", readme)]
        assert not unnamed, f"{cls.__name__} fields the README does not name: {unnamed}"
