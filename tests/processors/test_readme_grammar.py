"""The README's grammar example ends by itself on the embedded model: every row a complete expression followed by
EOS, never digits or terms until `max_new_tokens` (its earlier grammar, with Lark's unbounded `common.NUMBER`, ran
to the limit: `2.0 * 2.0 * 2.0 * 2.0000`)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
FIRST_LINE = "from hf_paged import GrammarLogitsProcessor"


def grammar_block() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.DOTALL | re.MULTILINE)
    found = [b for b in blocks if b.startswith(FIRST_LINE)]
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="module")
def embedded():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_paged.api.models import DEFAULT_MODEL_PATH

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)  # (stock generate: the same greedy tokens)
    return model, AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH, padding_side="left")


def test_the_readme_grammar_example_ends_each_row_with_eos(embedded):
    model, tokenizer = embedded
    namespace = {"model": model, "tokenizer": tokenizer}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(grammar_block(), "README grammar block", "exec"), namespace)  # noqa: S102 -- the README's own code, as test_readme_snippets runs it
    batch, out = namespace["batch"], namespace["out"]
    texts = tokenizer.batch_decode(out[:, batch.input_ids.shape[1]:], skip_special_tokens=True)
    expression = re.compile(r" ?[0-9()][0-9()+\-*/ ]* ?")
    for row, text in zip(out[:, batch.input_ids.shape[1]:].tolist(), texts):
        assert tokenizer.eos_token_id in row, text  # ended by the grammar, not by max_new_tokens
        assert expression.fullmatch(text) and not re.search(r"[0-9]{4}", text), text
    assert printed.getvalue().strip() == repr(texts)
    comment = re.search(r"^# (\[.*\])  with the embedded model", grammar_block(), re.MULTILINE)
    assert comment is not None and comment.group(1) == repr(texts)  # the README shows what it prints
