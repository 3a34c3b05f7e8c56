"""`hf-paged eval`: lm-evaluation-harness's `lm-eval run` with the model `hf-paged` (`integrations/lm_eval.py`).

    lm-eval run  --model hf --model_args pretrained=PATH --tasks T --batch_size 8
    hf-paged eval           --model_args pretrained=PATH --tasks T                 # the same, on the paged engine

Every other argument is lm-eval's own and means what it means there. Beyond it: `--model` may only say `hf` or
`hf-paged`; `--batch_size` (or `batch_size=` in `--model_args`) is accepted and unused (a task's requests all go
to the engine at once); `device=` in `--model_args` is passed as `--device` (not twice: lm-eval's TypeError); repeated
`--model_args` merge as in `lm-eval run` (later keys win); without `pretrained=` in them the embedded tiny model is
evaluated (in fp32 unless `dtype=` says otherwise; a note on stderr says so) with the other arguments given;
`--model` / `--batch_size` without a value are refused (exit 2); hf_paged's local tasks (`hf_paged_gen`, `hf_paged_mc`,
`hf_paged_ppl`: no hub) are always on the include path beside the caller's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hf_paged.errors import CliError, HfPagedError

USAGE = """usage: hf-paged eval [lm-eval run arguments]

Runs lm-evaluation-harness (`lm-eval run`) with hf_paged's model: change `lm-eval run --model hf` to `hf-paged eval`.
  --model_args pretrained=PATH[,dtype=float32,block_size=16,...]   lm-eval's hf arguments and PagedConfig fields
                                                                    (default: the embedded tiny model, fp32)
  --tasks T1,T2   --num_fewshot N   --limit N   --include_path DIR   --output_path DIR   --log_samples
  --apply_chat_template   --device cpu|cuda   --batch_size (accepted, unused: requests run continuously batched)
Local tasks that need no hub: hf_paged_gen (generate_until), hf_paged_mc (multiple choice), hf_paged_ppl (perplexity).
All of lm-eval's arguments: `lm-eval run --help`.
"""


def run_eval(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        from lm_eval._cli import HarnessCLI

        import hf_paged.integrations.lm_eval  # noqa: F401 -- registers the model `hf-paged`
    except ImportError as exc:
        raise CliError(f"hf-paged eval needs lm-evaluation-harness ({exc}); install it: pip install 'hf_paged[eval]'")
    parser = HarnessCLI()
    args = parse_arguments(parser, argv)
    _check_run_arguments(args)
    if args.config is None:  # refused now, not after lm-eval has indexed its ~15k task files (~10 s)
        _check_model_arguments(args.model_args, args.device)
    try:
        parser.execute(args)
    except HfPagedError:
        raise
    except (ValueError, FileNotFoundError) as exc:  # lm-eval's own input checks (unknown task, bad path, ...)
        raise CliError(f"lm-eval: {exc}") from None
    except OSError as exc:  # from_pretrained: no such hub id, no network, a directory without a model
        raise CliError(f"cannot load the model: {str(exc).splitlines()[0]}") from None
    return 0


def parse_arguments(parser, argv: list[str]):
    """`hf-paged eval`'s argv as lm-eval's `HarnessCLI` parser reads it for `lm-eval run --model hf-paged`, with the
    embedded model filled in when none is named and hf_paged's tasks on the include path."""
    device_given = _names_option(argv, "--device")
    args = parser._parser.parse_args(["run", *_lm_eval_arguments(list(argv))])  # (`parse_args()` reads sys.argv)
    if args.config is None:  # (a --config file may name the model itself)
        args.model_args = _model_args(args.model_args)
        if "device" in args.model_args:  # lm-eval passes --device beside the model arguments (its default when
            if device_given:             # none is given: cuda:0): PagedLM got `device` twice, a TypeError
                raise CliError("the device is given twice, as device= in --model_args and as --device: give one")
            args.device = args.model_args.pop("device")
        if args.model_args.pop("batch_size", None) is not None:  # (lm-eval passes its own: a TypeError too)
            print(_BATCH_SIZE_NOTE.format("batch_size= in --model_args"), file=sys.stderr)
    args.include_path = _include_paths(args.include_path)
    return args


def _check_run_arguments(args) -> None:
    """What lm-eval takes and fails on only after the model is loaded (`--limit -1`), or after the whole evaluation
    (an `--output_path` under a regular file: results not saved, exit 0), or never (`--include_path` that does not
    exist, `--num_fewshot -1`), refused up front."""
    if args.limit is not None and args.limit <= 0:
        raise CliError(f"--limit must be > 0, got {args.limit:g}: a count of examples per task (e.g. --limit 10) or "
                       "a fraction of them in (0, 1] (e.g. --limit 0.1)")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise CliError(f"--num_fewshot must be >= 0, got {args.num_fewshot}: the number of examples before each "
                       "question (0 for none)")
    if args.include_path is not None and not isinstance(args.include_path, str):  # (ours is always last)
        given = args.include_path[0]
        if not os.path.exists(given):
            raise CliError(f"--include_path {given!r} does not exist: give the folder of your task files")
    if args.output_path:
        _check_output_path(args.output_path)


def _check_output_path(given: str) -> None:
    """lm-eval writes its results into the folder `--output_path` (made with its parents), or beside it for a name
    ending in `.json`: the nearest part of that folder that exists must be a writable folder."""
    path = Path(given)
    folder = path.parent if path.suffix == ".json" else path
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "a dangling link" if existing.is_symlink() and not existing.exists() else "a file"
        raise CliError(f"--output_path {given!r}: {str(existing)!r} is {what}, not a folder, so no results could be "
                       "saved there; give a folder (made if missing) or a file name ending in .json")
    if not os.access(existing, os.W_OK):
        raise CliError(f"--output_path {given!r}: folder {str(existing)!r} is not writable; pick another path")


def _check_model_arguments(model_args: dict, device: str | None) -> None:
    """What PagedLM refuses before it loads a model, given as lm-eval will give it: the model arguments, then
    `--device` (lm-eval passes it beside them)."""
    from hf_paged.integrations.lm_eval import check_model_arguments

    given = {k: v for k, v in model_args.items() if k != "pretrained"}
    if device is not None and "device" not in given:
        given["device"] = device
    check_model_arguments(model_args.get("pretrained"), given)


def _lm_eval_arguments(argv: list[str]) -> list[str]:
    """argv for `lm-eval run`: `--model hf-paged`, `--batch_size` dropped, `--device` the machine's unless given.
    `--model_args` stays for lm-eval's own parser, which merges repeated ones (later keys win) as `lm-eval run`
    does; `_model_args` then fills in the embedded model when none is named."""
    model = _pop_option(argv, "--model", "-M")
    if model is not None and model not in ("hf", "hf-paged"):
        raise CliError(f"hf-paged eval runs the model hf-paged (lm-eval's hf on the paged engine), not --model "
                       f"{model}; drop --model or use `lm-eval run` for other backends")
    if _pop_option(argv, "--batch_size", "-b") is not None:
        print(_BATCH_SIZE_NOTE.format("--batch_size"), file=sys.stderr)
    if not _names_option(argv, "--device"):
        import torch

        argv += ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
    return ["--model", "hf-paged", *argv]


def _model_args(parsed: dict | None) -> dict:
    """lm-eval's parsed `--model_args` (all of them merged), keys stripped of spaces (`a=1, b=2`); without
    `pretrained=`, the embedded tiny model (fp32 unless `dtype=` is given: it is stored in fp16), said on stderr
    so that a forgotten `pretrained=` is not mistaken for a run of one's own model."""
    from hf_paged.api.models import DEFAULT_MODEL_PATH

    given = {str(key).strip(): value for key, value in (parsed or {}).items()}
    if given.get("pretrained") is not None:
        return given
    print(f"hf-paged eval: note: no pretrained= in --model_args: evaluating the embedded tiny model "
          f"({DEFAULT_MODEL_PATH}); give --model_args pretrained=PATH to evaluate yours", file=sys.stderr)
    return {"pretrained": str(DEFAULT_MODEL_PATH), "dtype": "float32", **{k: v for k, v in given.items()
                                                                          if k != "pretrained"}}


def _pop_option(argv: list[str], *names: str) -> str | None:
    """Remove `--name VALUE` / `--name=VALUE` from argv; its value (the last one given), or None. A value that is
    another option (`--model --tasks T`) is refused: it would swallow that option."""
    value = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in names:
            if i + 1 >= len(argv) or _is_option(argv[i + 1]):
                raise CliError(f"{arg} needs a value (e.g. {_EXAMPLES[names[0]]})")
            value = argv[i + 1]
            del argv[i : i + 2]
        elif any(arg.startswith(f"{name}=") for name in names):
            value = arg.split("=", 1)[1]
            if not value:
                raise CliError(f"{arg} needs a value (e.g. {names[0]}={_EXAMPLES[names[0]]})")
            del argv[i]
        else:
            i += 1
    return value


_EXAMPLES = {"--model": "hf-paged", "--batch_size": "8"}
_BATCH_SIZE_NOTE = ("hf-paged eval: note: {} is unused: every request of a task runs on the engine at once "
                    "(continuous batching)")


def _names_option(argv: list[str], name: str) -> bool:
    """Whether argv gives `name`, as `--name VALUE` or `--name=VALUE`."""
    return any(a == name or a.startswith(f"{name}=") for a in argv)


def _is_option(arg: str) -> bool:
    """`--tasks`, `-a`: an option name, not a value (a negative number is a value)."""
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def _include_paths(given: str | None) -> str | list[str]:
    from hf_paged.api.models import DEFAULT_MODEL_PATH

    ours = str(DEFAULT_MODEL_PATH.parent / "lm_eval_tasks")
    return ours if given is None else [given, ours]
