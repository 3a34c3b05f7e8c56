"""Checkpoints shaped like the real ones (tiny weights, `save_pretrained`, the embedded byte-level tokenizer with
the families' special tokens), generated and served as users do, against stock transformers.

Their quirks: an EOS *list* in generation_config (Llama-3, Phi-3, Gemma, Qwen2.5), sampling defaults in it
(Llama-3.x, Qwen2.5), a chat template that writes the BOS while the tokenizer also adds one (Llama-3, Mistral,
Gemma), no pad token (Mistral, GPT-2), pad == eos (Phi-3), `dtype: bfloat16` loaded with `dtype="auto"`, sharded
safetensors, tied and untied embeddings, `rope_scaling` llama3 / yarn / dynamic, `model_max_length` far from
`max_position_embeddings`, and GPT-2's `max_length: 20` with no chat template.

Each EOS id of a list is planted into the greedy continuation (the output-embedding rows of the token greedy picks
at step k and of the EOS are swapped), so the model really emits it: wrapped `generate` and the server must stop
there as stock does (`finish_reason: "stop"`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing
from transformers import (
    GemmaConfig,
    GenerationConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

import hf_paged
from hf_paged.api.loading import load_model
from hf_paged.api.models import DEFAULT_MODEL_PATH

LAYERS = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
MESSAGES = [{"role": "user", "content": "Tell me a story about a cat"}]
TEXT = "Once upon a time"

LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
QWEN_TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nYou are "
                 "helpful.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MISTRAL_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} "
                    "[/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
                  "m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}"
                  "<start_of_turn>model\n{% endif %}")
PHI3_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@dataclass
class Shape:
    """One family's quirks: its special tokens, tokenizer, config and generation_config."""

    name: str
    specials: list[str]
    config: type
    config_kwargs: dict
    generation: dict  # generation_config fields; eos/bos/pad given as token strings are turned into ids
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    add_bos: bool = False
    template: str | None = None
    model_max_length: int = 2048
    dtype: torch.dtype = torch.float32
    shard: str | None = None
    token_fields: dict = field(default_factory=dict)  # config fields named by token strings


SHAPES = [
    Shape("llama3", ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eom_id|>", "<|eot_id|>"], LlamaConfig,
          dict(**LAYERS, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
               rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
          {"eos_token_id": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], "bos_token_id": "<|begin_of_text|>",
               "do_sample": True, "temperature": 0.6, "top_p": 0.9},
          bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True, template=LLAMA3_TEMPLATE,
          model_max_length=10**30, dtype=torch.bfloat16, shard="20KB",
          token_fields={"bos_token_id": "<|begin_of_text|>",
                        "eos_token_id": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]}),
    Shape("qwen25", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], Qwen2Config,
          dict(**LAYERS, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
               rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
          {"eos_token_id": ["<|im_end|>", "<|endoftext|>"], "pad_token_id": "<|endoftext|>", "do_sample": True,
               "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20},
          eos="<|im_end|>", pad="<|endoftext|>", template=QWEN_TEMPLATE, model_max_length=131072,
          dtype=torch.bfloat16, token_fields={"eos_token_id": "<|im_end|>"}),
    Shape("mistral", ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], MistralConfig,
          dict(**LAYERS, num_key_value_heads=2, max_position_embeddings=256, sliding_window=None,
               rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
          {"eos_token_id": "</s>", "bos_token_id": "<s>"},
          bos="<s>", eos="</s>", add_bos=True, template=MISTRAL_TEMPLATE, shard="20KB",
          token_fields={"bos_token_id": "<s>", "eos_token_id": "</s>"}),
    Shape("gemma", ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], GemmaConfig,
          dict(**LAYERS, num_key_value_heads=1, head_dim=8, max_position_embeddings=256),
          {"eos_token_id": ["<eos>", "<end_of_turn>"], "bos_token_id": "<bos>", "pad_token_id": "<pad>"},
          bos="<bos>", eos="<eos>", pad="<pad>", add_bos=True, template=GEMMA_TEMPLATE, model_max_length=8192,
          dtype=torch.bfloat16,
          token_fields={"bos_token_id": "<bos>", "eos_token_id": "<eos>", "pad_token_id": "<pad>"}),
    Shape("phi3", ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"], Phi3Config,
          dict(**LAYERS, num_key_value_heads=4, max_position_embeddings=256, original_max_position_embeddings=256),
          {"eos_token_id": ["<|endoftext|>", "<|end|>", "<|assistant|>"], "pad_token_id": "<|endoftext|>"},
          eos="<|endoftext|>", pad="<|endoftext|>", template=PHI3_TEMPLATE, model_max_length=4096,
          token_fields={"eos_token_id": "<|endoftext|>", "pad_token_id": "<|endoftext|>"}),
    Shape("gpt2", ["<|endoftext|>"], GPT2Config, {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 256},
          {"eos_token_id": "<|endoftext|>", "bos_token_id": "<|endoftext|>", "max_length": 20},
          bos="<|endoftext|>", eos="<|endoftext|>", model_max_length=1024,
          token_fields={"bos_token_id": "<|endoftext|>", "eos_token_id": "<|endoftext|>"}),
]


def _ids(tokenizer, value):
    return [_ids(tokenizer, v) for v in value] if isinstance(value, list) else tokenizer.convert_tokens_to_ids(value)


def build(shape: Shape, directory: Path) -> Path:
    """Save `shape` as a checkpoint in `directory` (random weights, seeded)."""
    base = Tokenizer.from_file(str(DEFAULT_MODEL_PATH / "tokenizer.json"))
    base.post_processor = None  # the embedded tokenizer adds its own BOS: the shape decides
    base.add_special_tokens(shape.specials)
    if shape.add_bos:
        bos_id = base.token_to_id(shape.bos)
        base.post_processor = TemplateProcessing(single=f"{shape.bos}:0 $A:0", special_tokens=[(shape.bos, bos_id)])
    named = {"bos_token": shape.bos, "eos_token": shape.eos, "pad_token": shape.pad}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=base, model_max_length=shape.model_max_length,
                                        **{k: v for k, v in named.items() if v is not None})
    if shape.template is not None:
        tokenizer.chat_template = shape.template
    config = shape.config(**shape.config_kwargs, vocab_size=len(tokenizer),
                          **{k: _ids(tokenizer, v) for k, v in shape.token_fields.items()})
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # larger weights than the init's: the tiny model's greedy text varies more
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.3)
    model.generation_config = GenerationConfig(**{k: _ids(tokenizer, v) if k.endswith("token_id") else v
                                                  for k, v in shape.generation.items()})
    model.to(shape.dtype).save_pretrained(directory, **({"max_shard_size": shape.shard} if shape.shard else {}))
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: s.name)
def checkpoint(request, tmp_path_factory):
    shape = request.param
    return shape, build(shape, tmp_path_factory.mktemp(shape.name))


def _eos_list(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return eos if isinstance(eos, list) else [eos]


def _prompt(tokenizer, chat: bool) -> list[int]:
    if chat:
        return list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
    return tokenizer(TEXT)["input_ids"]


def _stock_greedy(model, prompt, max_new_tokens=12, **kwargs) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         **kwargs)
    return out[0, len(prompt):].tolist()


def _plant(model, prompt: list[int], eos: int) -> tuple[object, int] | None:
    """A copy of `model` whose greedy continuation of `prompt` ends with `eos` at some step k (the rows of eos and of
    the token greedy picks at k swapped in the output embedding); (copy, k), or None when no step k qualifies."""
    free = _stock_greedy(model, prompt, eos_token_id=None, repetition_penalty=1.0)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    for k in range(1, len(free)):
        token = free[k]
        if token in free[:k] or eos in free[:k] or (tied and (token in prompt or eos in prompt)):
            continue
        planted = copy.deepcopy(model)
        head = planted.get_output_embeddings().weight
        with torch.no_grad():
            head[[token, eos]] = head[[eos, token]].clone()
        return planted, k
    return None


# greedy over a config that samples; sampled with the config's own settings (seeded); the config's own length rule
CALLS = {"greedy": {"do_sample": False, "max_new_tokens": 16}, "sampled": {"max_new_tokens": 16, "do_sample": True},
         "config_length": {}}


def _generate(model, prompt, kwargs):
    ids = torch.tensor([prompt])
    torch.manual_seed(3)
    return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)


def test_load_auto_dtype_and_wrapped_generate_equal_stock(checkpoint):
    """dtype="auto" gives the checkpoint's dtype (bf16, sharded files too); greedy (do_sample=False over a config
    that samples), seeded sampling with the config's own settings, and the config's own length rule (GPT-2's
    max_length=20): the wrapped model's tokens are stock's, in fp32 and in the checkpoint's dtype."""
    shape, directory = checkpoint
    for dtype in ("float32", "auto"):
        model, tokenizer = load_model(str(directory), dtype=dtype)
        assert model.dtype == (shape.dtype if dtype == "auto" else torch.float32)
        prompt = _prompt(tokenizer, shape.template is not None)
        stock = {name: _generate(model, prompt, kwargs) for name, kwargs in CALLS.items()}
        hf_paged.wrap(model)
        try:
            for name, kwargs in CALLS.items():
                assert torch.equal(_generate(model, prompt, kwargs), stock[name]), (shape.name, dtype, name)
        finally:
            hf_paged.unwrap(model)
        if shape.name == "gpt2":  # max_length=20 counts the prompt, in stock as in ours
            assert stock["config_length"].shape[1] == 20


def test_every_eos_of_the_list_stops_generate_as_stock(checkpoint):
    shape, directory = checkpoint
    model, tokenizer = load_model(str(directory))
    prompt = _prompt(tokenizer, False)
    for eos in _eos_list(model):
        found = _plant(model, prompt, eos)
        assert found is not None, (shape.name, eos)
        planted, k = found
        stock = _stock_greedy(planted, prompt)
        assert stock[k] == eos and len(stock) == k + 1, (shape.name, eos, stock)
        hf_paged.wrap(planted)
        assert _stock_greedy(planted, prompt) == stock


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_the_server_tokenizes_and_stops_as_stock(checkpoint, chat):
    """The server's prompt ids (`return_token_ids`, `usage.prompt_tokens`) are stock's `apply_chat_template` (one
    BOS where the template writes it and the tokenizer would add another) or `tokenizer(text)`; each EOS of the list
    ends the choice with "stop" at stock's token; a tokenizer without a chat template gets a 400 naming the fix."""
    pytest.importorskip("fastapi")
    from hf_paged import Engine, PagedConfig
    from hf_paged.serving import ServerSettings, build_app
    from tests.serving.conftest import ServerThread

    shape, directory = checkpoint
    model, tokenizer = load_model(str(directory))
    if chat and shape.template is None:
        engine = Engine(model, PagedConfig(block_size=16, num_blocks=64))
        with ServerThread(build_app(engine, tokenizer, ServerSettings(model_name="m"))) as server:
            answer = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES}, timeout=120)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "no_chat_template"
        return
    prompt = _prompt(tokenizer, chat)
    if chat and shape.bos is not None and shape.add_bos:
        bos = tokenizer.convert_tokens_to_ids(shape.bos)
        assert prompt[0] == bos and prompt[1] != bos  # the template's BOS, not a second one
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    for eos in _eos_list(model):
        if tied and chat and eos in prompt:
            continue  # (the swap would change the prompt's embedding: the completions case covers this EOS)
        planted, _k = _plant(model, prompt, eos)
        stock = _stock_greedy(planted, prompt)
        engine = Engine(planted, PagedConfig(block_size=16, num_blocks=64))
        body = {"temperature": 0, "max_tokens": 12, "return_token_ids": True}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body.update({"messages": MESSAGES} if chat else {"prompt": TEXT})
        with ServerThread(build_app(engine, tokenizer, ServerSettings(model_name="m"))) as server:
            answer = httpx.post(server.url + path, json=body, timeout=120).json()
        choice = answer["choices"][0]
        assert choice["prompt_token_ids"] == prompt and answer["usage"]["prompt_tokens"] == len(prompt)
        assert choice["token_ids"] == stock and stock[-1] == eos, (shape.name, eos)
        assert choice["finish_reason"] == "stop"


def test_the_shapes_are_what_they_claim(checkpoint):
    """The saved files carry the quirks this module is about (a guard on the builder itself)."""
    shape, directory = checkpoint
    config = json.loads((directory / "config.json").read_text())
    assert config["dtype"] == str(shape.dtype).removeprefix("torch.")
    assert (directory / "model.safetensors.index.json").is_file() == (shape.shard is not None)
    generation = json.loads((directory / "generation_config.json").read_text())
    assert isinstance(generation["eos_token_id"], list) == isinstance(shape.generation["eos_token_id"], list)
    _model, tokenizer = load_model(str(directory))
    assert (tokenizer.pad_token is None) == (shape.pad is None)
    assert (tokenizer.chat_template is None) == (shape.template is None)
