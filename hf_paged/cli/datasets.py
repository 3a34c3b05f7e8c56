"""Deterministic text sources that exist offline on every machine.

Shared by `scripts/train_tiny_lm.py`, the benchmarks, the tests and the demo, so that "held-out text" and
"a passkey example" mean the same bytes everywhere:

- `stdlib_documents(split)`: the Python standard library's `.py` files of the running interpreter, split into
  train and held-out by file. The split depends only on a file's relative path (a blake2b digest), never on
  the order `os.walk` returns or on `hash()` salting, so a file lands in the same split on every run.
- `passkey_example(seed, num_tokens)`: a filler context with a pass key near its start and a question at its
  end whose answer prefix ("The pass key is #") repeats the key's line verbatim, so copying answers it.

The default model's tokenizer is byte-level (`hf_paged.api.models`): one token per UTF-8 byte plus a BOS, so
`num_tokens` counts bytes and `PasskeyExample.prompt_ids` is `[BOS] + bytes`. Other tokenizers should
tokenize `prompt_text` themselves.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BYTE_BOS_TOKEN_ID",
    "HELDOUT_PERCENT",
    "PasskeyExample",
    "StdlibDocument",
    "passkey_example",
    "stdlib_documents",
]

# The default model's byte vocabulary: ids 0-255 are the bytes themselves, then BOS, EOS, PAD. Kept here
# (not in `hf_paged.api.models`) so this module imports neither torch nor transformers.
BYTE_BOS_TOKEN_ID = 256

HELDOUT_PERCENT = 10  # share of stdlib files (by digest of the path) held out from training


@dataclass(slots=True, frozen=True)
class StdlibDocument:
    """One standard-library source file."""

    path: str  # relative to the stdlib directory, with "/" separators (e.g. "json/decoder.py")
    text: str  # the file's contents, decoded as UTF-8


def _split_of(relative_path: str) -> str:
    digest = hashlib.blake2b(relative_path.encode("utf-8"), digest_size=8).digest()
    return "heldout" if int.from_bytes(digest, "big") % 100 < HELDOUT_PERCENT else "train"


def stdlib_documents(split: str, *, stdlib_dir: str | os.PathLike[str] | None = None) -> list[StdlibDocument]:
    """The standard library's `.py` files of this interpreter that fall in `split`, sorted by path.

    `site-packages` is excluded (it differs between environments); files that are not valid UTF-8 are skipped
    (a few test fixtures on purpose). Which split a file belongs to is a pure function of its relative path.

    Args:
        split (`str`): `"train"` (about 90% of the files) or `"heldout"` (the rest).
        stdlib_dir (`str` or `os.PathLike`, *optional*): directory to read instead of this interpreter's
            stdlib (`sysconfig.get_paths()["stdlib"]`); tests use it with a tiny tree.

    Returns:
        `list[StdlibDocument]`: the documents, in sorted path order.

    Example:
        >>> docs = stdlib_documents("heldout")
        >>> all(d.path.endswith(".py") for d in docs)
        True
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"stdlib_documents: split must be 'train' or 'heldout', got {split!r}; pass one of them")
    root = Path(stdlib_dir if stdlib_dir is not None else sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(
            f"stdlib_documents: {root} is not a directory; pass stdlib_dir= pointing at a Python 'lib' folder"
        )
    documents = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("site-packages/") or "/site-packages/" in relative:
            continue
        if _split_of(relative) != split:
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text:
            documents.append(StdlibDocument(path=relative, text=text))
    return documents


@dataclass(slots=True, frozen=True)
class PasskeyExample:
    """A passkey-retrieval prompt and its answer."""

    prompt_text: str  # ASCII: intro, pass key line, filler, question ending in "The pass key is #"
    prompt_ids: list[int]  # default-model ids: [BOS] + the prompt's bytes; len == num_tokens
    answer: str  # the pass key: 5 distinct digits, e.g. "48213"
    passkey_offset: int  # byte offset of the pass key's line in `prompt_text`


_INTRO = "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n"
_QUESTION = "\nWhat is the pass key? The pass key is #"
# Plain sentences; seeded choice among them keeps the filler from being a single repeated line.
_FILLER = (
    "The grass is green. ",
    "The sky is blue. ",
    "The sun is yellow. ",
    "Here we go. ",
    "There and back again. ",
    "The river runs to the sea. ",
    "A cat sleeps on the warm stone wall. ",
    "The wind moves the old trees. ",
    "Rain falls on the quiet town. ",
    "The road goes on and on. ",
    "Birds sing in the early morning. ",
    "The hills are far away. ",
)
NUM_PASSKEY_DIGITS = 5


def _key_line(key: str) -> str:
    return f"The pass key is #{key}. Remember it. {key} is the pass key.\n"


def passkey_example(seed: int, num_tokens: int, *, depth: float = 0.0) -> PasskeyExample:
    """A filler context of exactly `num_tokens` default-model tokens (BOS + bytes) hiding a 5-digit pass key.

    Layout: intro line, `depth` of the filler, the pass key line ("The pass key is #48213. Remember it. ..."),
    the rest of the filler, then the question "What is the pass key? The pass key is #" whose answer prefix
    repeats the key line verbatim; the filler holds no digits and no "#". The filler is
    cut at a byte so the prompt has exactly the requested length.

    Args:
        seed (`int`): selects the key and the filler; the same seed always gives the same example.
        num_tokens (`int`): prompt length in default-model tokens (bytes + 1 for BOS); at least 202.
        depth (`float`, *optional*, defaults to 0.0): where the key line goes, as a share of the filler
            (0.0: right after the intro line, "near the start"; 1.0: just before the question).

    Returns:
        `PasskeyExample`.

    Example:
        >>> ex = passkey_example(0, 512)
        >>> len(ex.prompt_ids), ex.prompt_text.endswith("The pass key is "), len(ex.answer)
        (512, True, 5)
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey_example: depth must be within [0, 1], got {depth}; pass a share of the filler")
    rng = random.Random(f"passkey/{seed}")  # str seeds hash deterministically (sha512), unlike hash()
    # Distinct digits: after each digit of the key comes one definite next digit, as in a phone number read
    # back; "#" occurs nowhere else, so the question's last byte points at exactly one place.
    key = "".join(rng.sample("0123456789", NUM_PASSKEY_DIGITS))
    key_line = _key_line(key)
    num_filler = num_tokens - 1 - len(_INTRO) - len(key_line) - len(_QUESTION)
    if num_filler < 16:
        minimum = num_tokens - num_filler + 16
        raise ValueError(f"passkey_example: num_tokens={num_tokens} leaves no room for filler; use >= {minimum}")
    parts: list[str] = []
    length = 0
    while length < num_filler:
        sentence = rng.choice(_FILLER)
        parts.append(sentence)
        length += len(sentence)
    filler = "".join(parts)[:num_filler]
    # Insert the key line at a sentence boundary so it never splits a word.
    cut = round(depth * num_filler)
    boundary = filler.rfind(". ", 0, cut)
    cut = 0 if boundary < 0 or cut == 0 else boundary + 2
    prompt_text = _INTRO + filler[:cut] + key_line + filler[cut:] + _QUESTION
    prompt_ids = [BYTE_BOS_TOKEN_ID, *prompt_text.encode("ascii")]
    assert len(prompt_ids) == num_tokens
    return PasskeyExample(prompt_text=prompt_text, prompt_ids=prompt_ids, answer=key, passkey_offset=len(_INTRO) + cut)
