"""The `hf-paged` command: `demo`, `bench`, `generate`, `serve`.

Every user error (a bad or unknown argument, a missing file, a model that will not load, a schema that does not
compile, a setting the engine refuses) ends with one line on stderr and exit status 2, never a traceback: usage
errors become `CliError`, and the library's own typed errors (`hf_paged.errors.HfPagedError`) are printed the same
way. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from hf_paged.api.loading import check_device, load_model  # noqa: F401 -- load_model: part of this face
from hf_paged.errors import CliError

WORKLOADS = ("ragged", "shared-prefix", "few-shot", "multi-turn")
_DEFAULT_MODEL_HELP = "a local model directory (or a hub id when online); default: the embedded tiny model " \
                      "(hf_paged.default_model())"


class _Parser(argparse.ArgumentParser):
    """argparse, except that a usage error raises `CliError` (one line) instead of printing the usage block."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hf-paged", description="Paged KV cache + continuous batching for HF models")
    sub = parser.add_subparsers(dest="command", required=True)  # subcommand parsers are `_Parser`s too
    sub.add_parser("demo", help="run the mixed demo workload on the embedded default model and print one table")
    bench = sub.add_parser("bench", help="run a benchmark workload, hf_paged vs stock generate "
                                         "(default: on the embedded model)")
    bench.add_argument("--model", default=None, help=_DEFAULT_MODEL_HELP)
    bench.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    bench.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    bench.add_argument("--workload", default="ragged", help=f"one of {', '.join(WORKLOADS)}")
    bench.add_argument("--num-prompts", type=int, default=32)
    bench.add_argument("--out", default="bench_result.json", help="where to write the JSON result")
    bench.add_argument("--plot", default=None, help="PNG path for a plot (needs matplotlib)")
    gen = sub.add_parser("generate", help="batch generation: one JSON line per prompt on stdout "
                                          "(default: on the embedded model)")
    gen.add_argument("--model", default=None, help=_DEFAULT_MODEL_HELP)
    gen.add_argument("--prompts", required=True, help="JSONL file: one {\"prompt\": ...} object or string per line")
    gen.add_argument("--schema", default=None, help="JSON-schema file constraining every output")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    sub.add_parser("eval", help="lm-evaluation-harness on the paged engine: `lm-eval run --model hf ...` becomes "
                                "`hf-paged eval ...` (needs hf_paged[eval]; `hf-paged eval --help`)")
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over one engine (needs hf_paged[serve])")
    from hf_paged.serving.server import add_serve_arguments

    add_serve_arguments(serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    from hf_paged.errors import HfPagedError

    argv_given = argv
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["eval"]:  # lm-eval's own arguments, parsed by lm-eval
            from hf_paged.cli.eval import run_eval

            return run_eval(argv[1:])
        args = build_parser().parse_args(argv)
        args.whole_process = argv_given is None  # the `hf-paged` command itself, not a call from Python code
        return _run(args)
    except (CliError, HfPagedError) as exc:
        print(f"hf-paged: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    """Check the arguments that need no model, then run the subcommand."""
    if args.command == "demo":
        from hf_paged.cli.demo import run_demo

        run_demo()
    elif args.command == "bench":
        from hf_paged.cli.bench import run_bench

        if args.workload not in WORKLOADS:
            raise CliError(f"unknown workload {args.workload!r}; choose one of {', '.join(WORKLOADS)}")
        if args.num_prompts < 1:
            raise CliError(f"--num-prompts must be >= 1, got {args.num_prompts}")
        _check_writable("--out", args.out)
        if args.plot is not None:
            _check_writable("--plot", args.plot)
            _check_plotting()
        args.model = _model_or_default(args.model)
        run_bench(args)
    elif args.command == "serve":
        from hf_paged.serving.server import run_serve

        if not 0 <= args.port <= 65535:
            raise CliError(f"--port must be between 0 and 65535, got {args.port}")
        check_device(args.device)
        if args.replicas is not None or args.address is not None:  # N engine replicas on Ray Serve
            from hf_paged.scaleout.cli import run_replicas

            return run_replicas(args)
        code = run_serve(args)
        if getattr(args, "whole_process", False):
            from hf_paged.serving.server import end_process

            end_process(code)
        return code
    else:
        run_generate(args)
    return 0


def _model_or_default(path: str | None) -> str:
    if path is not None:
        return path
    from hf_paged.api.models import DEFAULT_MODEL_PATH

    return str(DEFAULT_MODEL_PATH)


def _check_writable(option: str, path: str) -> None:
    """Fail before the work, not after it, when a result cannot be written."""
    file = Path(path)
    if file.is_dir():
        raise CliError(f"{option} {path!r} is a directory; give a file path")
    folder = file.parent
    if not folder.is_dir():
        raise CliError(f"{option} {path!r}: folder {str(folder)!r} does not exist; create it or pick another path")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{option} {path!r}: folder {str(folder)!r} is not writable; pick another path")


def _check_plotting() -> None:
    """`--plot` needs matplotlib: say so before the run (minutes), not after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError("--plot needs matplotlib, which is not installed: pip install 'hf_paged[plot]', or leave "
                       "--plot out") from None


def _input_file(what: str, path: str) -> Path:
    file = Path(path)
    if file.is_dir():
        raise CliError(f"{what} file {path!r} is a directory, not a file; give the path of the file in it")
    if not file.is_file():
        raise CliError(f"{what} file {path!r} not found")
    return file


def read_prompts(path: str) -> list[str]:
    file = _input_file("prompts", path)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"prompts file {path!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{path}:{n}: not JSON ({exc.msg}); write one JSON object or string per line") from None
        if isinstance(item, dict):
            item = item.get("prompt")
        if not isinstance(item, str):
            raise CliError(f"{path}:{n}: expected a string or an object with a \"prompt\" string")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise CliError(f"{path}:{n}: the prompt holds a lone UTF-16 surrogate escape (such as \\ud800), which is "
                           "no Unicode text; write the text as UTF-8, or an astral character as a surrogate pair") from None
        prompts.append(item)
    if not prompts:
        raise CliError(f"prompts file {path!r} holds no prompts")
    return prompts


def read_schema(path: str | None):
    """The schema of a file, checked against its meta-schema and the nesting budget before any model is loaded."""
    if path is None:
        return None
    from hf_paged.errors import HfPagedError
    from hf_paged.processors.json_schema import MAX_SCHEMA_NESTING, load_schema

    file = _input_file("schema", path)
    try:
        schema = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CliError(f"schema file {path!r} does not parse as JSON: {exc.msg} at line {exc.lineno}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"schema file {path!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except RecursionError:  # json nests one C frame per level: hundreds of levels, far past the budget below
        raise CliError(
            f"schema {path!r}: the schema nests deeper than {MAX_SCHEMA_NESTING} JSON levels; flatten it (e.g. move "
            "repeated parts to $defs and refer to them with $ref)"
        ) from None
    try:
        return load_schema(schema)
    except HfPagedError as exc:
        raise CliError(f"schema {path!r}: {exc}") from None


def run_generate(args) -> None:
    from hf_paged import SamplingParams, unwrap, wrap
    from hf_paged.errors import HfPagedError

    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts = read_prompts(args.prompts)
    schema = read_schema(args.schema)
    model, tokenizer = load_model(_model_or_default(args.model), args.device)
    processors = []
    if schema is not None:
        from hf_paged.processors import JSONSchemaLogitsProcessor

        try:
            processors = [JSONSchemaLogitsProcessor(schema, tokenizer)]
        except HfPagedError as exc:
            raise CliError(f"schema {args.schema!r}: {exc}") from None
    eos = model.generation_config.eos_token_id
    params = SamplingParams(max_new_tokens=args.max_new_tokens, eos_token_id=eos, logits_processors=processors)
    wrap(model)
    try:
        outs = model.generate_batch([tokenizer(p)["input_ids"] for p in prompts], sampling_params=params)
    finally:
        unwrap(model)
    for prompt, out in zip(prompts, outs.values()):
        text = tokenizer.decode(out.generated_tokens, skip_special_tokens=True)
        record = {"prompt": prompt, "text": text, "tokens": out.generated_tokens, "finish_reason": out.finish_reason,
                  "error": out.error}
        if schema is not None:
            record["valid"] = _validates(text, schema)
        print(json.dumps(record))


def _validates(text: str, schema) -> bool:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return False
    try:
        import jsonschema
    except ImportError:
        return True
    return jsonschema.Draft202012Validator(schema).is_valid(doc)

