"""Tests of the embedded default model (`hf_paged.api.models`, `hf_paged/assets/tiny-lm/`).

They load the committed checkpoint offline, check the tokenizer maps text to its bytes and back, that the
model generates, that it predicts held-out stdlib text far better than a byte unigram model, and that it
retrieves a pass key over a 512-token context.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from hf_paged.api.models import DEFAULT_MODEL_PATH, DefaultModel, default_model
from hf_paged.cli.datasets import BYTE_BOS_TOKEN_ID, passkey_example, stdlib_documents


@pytest.fixture(scope="module")
def tiny() -> DefaultModel:
    return default_model()


def test_checkpoint_files_are_complete_and_small():
    names = {p.name for p in DEFAULT_MODEL_PATH.iterdir()}
    expected = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert expected | {"README.md"} <= names
    assert (DEFAULT_MODEL_PATH / "model.safetensors").stat().st_size <= 10 * 2**20
    config = json.loads((DEFAULT_MODEL_PATH / "config.json").read_text())
    generation = json.loads((DEFAULT_MODEL_PATH / "generation_config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_attention_heads"] > config["num_key_value_heads"]  # GQA
    assert config["max_position_embeddings"] >= 1024
    assert config["vocab_size"] == 259
    assert config["eos_token_id"] == generation["eos_token_id"] == 257
    assert config["bos_token_id"] == generation["bos_token_id"] == BYTE_BOS_TOKEN_ID


def test_default_model_loads_in_the_requested_dtype(tiny):
    model, tokenizer = tiny
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32 and not model.training
    assert 1_000_000 < model.num_parameters() < 5_000_000
    assert model.config.eos_token_id == tokenizer.eos_token_id == 257


def test_tokenizer_round_trips_bytes(tiny):
    _, tokenizer = tiny
    text = "def f(x):\n\treturn x * 2  # héllo wörld 🙂\r\n"
    ids = tokenizer(text).input_ids
    assert ids == [BYTE_BOS_TOKEN_ID, *text.encode("utf-8")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(list(range(32, 127))) == bytes(range(32, 127)).decode("ascii")
    assert len(tokenizer) == 259
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (256, 257, 258)


def test_generate_greedy_is_deterministic_and_matches_the_forward(tiny):
    model, tokenizer = tiny
    ids = tokenizer("import os\nimport sys\n\n\ndef main(", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    again = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, again)
    assert out.shape == (1, ids.shape[1] + 12)
    # Greedy generation picks each token as the argmax of a full forward over everything before it.
    with torch.no_grad():
        logits = model(out[:, :-1]).logits
    assert torch.equal(logits[0, ids.shape[1] - 1 :].argmax(-1), out[0, ids.shape[1] :])


def test_beats_a_unigram_baseline_on_heldout_text(tiny):
    model, _ = tiny
    # Six held-out files, 256 bytes from the middle of each: fast, yet real unseen text.
    docs = [d.text.encode("utf-8") for d in stdlib_documents("heldout")]
    docs = [d for d in docs if len(d) >= 4096][::10][:6]
    windows = [d[len(d) // 2 : len(d) // 2 + 256] for d in docs]
    ids = torch.tensor([[BYTE_BOS_TOKEN_ID, *w] for w in windows])
    with torch.no_grad():
        logits = model(ids[:, :-1]).logits
    model_bpb = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).item() / math.log(2)
    # The unigram is fitted on the very bytes it is scored on: no unigram model can do better on them.
    data = torch.tensor(list(b"".join(windows)))
    probs = torch.bincount(data, minlength=256).double() / data.numel()
    unigram_bpb = -(probs[probs > 0] * probs[probs > 0].log2()).sum().item()
    assert unigram_bpb > 4.0
    assert model_bpb < unigram_bpb - 1.5


def test_retrieves_passkeys_over_512_tokens(tiny):
    model, tokenizer = tiny
    examples = [passkey_example(2_000_000 + i, 512) for i in range(8)]
    ids = torch.tensor([[*e.prompt_ids, *e.answer.encode("ascii")] for e in examples])
    with torch.no_grad():
        predicted = model(ids[:, :-1]).logits[:, 511:].argmax(-1)
    correct = (predicted == ids[:, 512:]).all(dim=1)
    assert correct.sum().item() >= 7
    # The same through `generate`, on the first example the forward got right.
    first = int(correct.nonzero()[0])
    prompt = torch.tensor([examples[first].prompt_ids])
    out = model.generate(prompt, max_new_tokens=5, do_sample=False)
    assert tokenizer.decode(out[0, 512:]) == examples[first].answer
