"""Tests of `hf_paged.cli.datasets`: the stdlib split and passkey examples are deterministic and well-formed."""

from __future__ import annotations

import pytest

from hf_paged.cli.datasets import (
    BYTE_BOS_TOKEN_ID,
    PasskeyExample,
    _split_of,
    passkey_example,
    stdlib_documents,
)


def _tree(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n")


def test_stdlib_split_is_by_path_disjoint_and_complete(tmp_path):
    names = [f"pkg{i % 3}/mod{i}.py" for i in range(40)] + ["site-packages/x/y.py", "notes.txt"]
    _tree(tmp_path, names)
    (tmp_path / "bad.py").write_bytes(b"\xff\xfe not utf-8")
    train = stdlib_documents("train", stdlib_dir=tmp_path)
    heldout = stdlib_documents("heldout", stdlib_dir=tmp_path)
    train_paths = [d.path for d in train]
    heldout_paths = [d.path for d in heldout]
    expected = sorted(n for n in names if n.endswith(".py") and not n.startswith("site-packages"))
    assert sorted(train_paths + heldout_paths) == expected
    assert train_paths == sorted(train_paths) and heldout_paths == sorted(heldout_paths)
    assert heldout_paths == [n for n in expected if _split_of(n) == "heldout"]
    assert 0 < len(heldout_paths) < len(train_paths)
    assert train[0].text == f"# {train[0].path}\n"


def test_split_of_is_a_fixed_function_of_the_path():
    # blake2b, not hash(): these values hold in every process and on every machine.
    assert [_split_of(f"m{i}.py") for i in range(12)] == [_split_of(f"m{i}.py") for i in range(12)]
    assert {_split_of("json/decoder.py"), _split_of("os.py")} <= {"train", "heldout"}


def test_stdlib_documents_of_this_interpreter_are_split():
    heldout = stdlib_documents("heldout")
    assert len(heldout) > 50
    assert all(d.path.endswith(".py") and "site-packages" not in d.path for d in heldout)


def test_stdlib_documents_rejects_unknown_split():
    with pytest.raises(ValueError, match="'train' or 'heldout'"):
        stdlib_documents("test")


@pytest.mark.parametrize("num_tokens", [202, 512, 1024])
def test_passkey_example_has_exact_length_and_answer(num_tokens):
    ex = passkey_example(7, num_tokens)
    assert isinstance(ex, PasskeyExample)
    assert len(ex.prompt_ids) == num_tokens
    assert ex.prompt_ids[0] == BYTE_BOS_TOKEN_ID
    assert ex.prompt_ids[1:] == list(ex.prompt_text.encode("ascii"))
    assert len(ex.answer) == 5 and ex.answer.isdigit()
    assert ex.prompt_text.endswith("What is the pass key? The pass key is #")
    key_line = f"The pass key is #{ex.answer}. Remember it."
    assert ex.prompt_text.count(key_line) == 1
    assert ex.prompt_text.index(key_line) == ex.passkey_offset
    assert ex.passkey_offset < 100  # depth 0: right after the intro line


def test_passkey_example_is_deterministic_and_seeded():
    assert passkey_example(3, 300) == passkey_example(3, 300)
    assert passkey_example(3, 300) != passkey_example(4, 300)
    # Fixed across processes and machines (string-seeded random.Random).
    assert passkey_example(0, 512).answer == passkey_example(0, 1024).answer


def test_passkey_depth_moves_the_key():
    near, far = passkey_example(5, 1024, depth=0.0), passkey_example(5, 1024, depth=1.0)
    assert near.answer == far.answer
    assert near.passkey_offset < 100
    assert far.passkey_offset > 800
    assert far.prompt_text[far.passkey_offset - 2 : far.passkey_offset] == ". "


def test_passkey_example_rejects_bad_arguments():
    with pytest.raises(ValueError, match="leaves no room for filler"):
        passkey_example(0, 100)
    with pytest.raises(ValueError, match="depth must be within"):
        passkey_example(0, 512, depth=1.5)
