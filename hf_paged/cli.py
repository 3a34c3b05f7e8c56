"""The `hf-paged` command: `demo`, `bench`, `generate`, `serve`.

Bad arguments end with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WORKLOADS = ("ragged", "shared-prefix", "few-shot", "multi-turn")


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-paged", description="Paged KV cache + continuous batching for HF models")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the mixed demo workload on the embedded default model and print one table")
    bench = sub.add_parser("bench", help="run a benchmark workload against a local or hub model")
    bench.add_argument("--model", required=True, help="a local model directory (or a hub id when online)")
    bench.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    bench.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    bench.add_argument("--workload", default="ragged", help=f"one of {', '.join(WORKLOADS)}")
    bench.add_argument("--num-prompts", type=int, default=32)
    bench.add_argument("--out", default="bench_result.json", help="where to write the JSON result")
    bench.add_argument("--plot", default=None, help="PNG path for a plot (needs matplotlib)")
    gen = sub.add_parser("generate", help="batch generation: one JSON line per prompt on stdout")
    gen.add_argument("--model", required=True)
    gen.add_argument("--prompts", required=True, help="JSONL file: one {\"prompt\": ...} object or string per line")
    gen.add_argument("--schema", default=None, help="JSON-schema file constraining every output")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over one engine (needs hf_paged[serve])")
    from hf_paged.serving.server import add_serve_arguments

    add_serve_arguments(serve)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from hf_paged.demo import run_demo

            run_demo()
        elif args.command == "bench":
            from hf_paged.cli_bench import run_bench

            if args.workload not in WORKLOADS:
                raise CliError(f"unknown workload {args.workload!r}; choose one of {', '.join(WORKLOADS)}")
            if args.num_prompts < 1:
                raise CliError(f"--num-prompts must be >= 1, got {args.num_prompts}")
            run_bench(args)
        elif args.command == "serve":
            from hf_paged.serving.server import run_serve

            return run_serve(args)
        else:
            run_generate(args)
    except CliError as exc:
        print(f"hf-paged: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def load_model(path: str, device: str = "cpu", dtype: str = "float32"):
    """Model and tokenizer from a directory or hub id, with one-line errors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda given but no CUDA device is available; use --device cpu")
    local = Path(path)
    if not local.exists() and ("/" not in path or path.startswith((".", "/"))):
        raise CliError(f"model {path!r} not found: give a model directory or a hub id")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot load model {path!r}: {str(exc).splitlines()[0]}") from None
    return model, tokenizer


def read_prompts(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise CliError(f"prompts file {path!r} not found")
    prompts = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
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
        prompts.append(item)
    if not prompts:
        raise CliError(f"prompts file {path!r} holds no prompts")
    return prompts


def read_schema(path: str | None):
    if path is None:
        return None
    file = Path(path)
    if not file.is_file():
        raise CliError(f"schema file {path!r} not found")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise CliError(f"schema file {path!r} does not parse as JSON: {exc.msg} at line {exc.lineno}") from None


def run_generate(args) -> None:
    from hf_paged import SamplingParams, unwrap, wrap
    from hf_paged.errors import HfPagedError

    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts = read_prompts(args.prompts)
    schema = read_schema(args.schema)
    model, tokenizer = load_model(args.model, args.device)
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


if __name__ == "__main__":
    sys.exit(main())
