"""`hf_paged/compat.py`: each entry against the installed libraries, and no private name of theirs elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from hf_paged import compat
from tests.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parent.parent / "hf_paged"

# The private names compat.py wraps: none may appear in another module of hf_paged.
PRIVATE = re.compile(r"(?<!\w)(?:_prepare_generation_config|_prepare_special_tokens|_get_stopping_criteria|_get_logits_processor"
                     r"|_attn_implementation_internal|_forward_hooks|_forward_pre_hooks|_compiled_call_impl"
                     r"|_global_forward|_cache_file|_load_index|_parameters\.values|_buffers\.values|_hf_hook)")


def test_private_names_only_here():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in ROOT.rglob("*.py") if p.name != "compat.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if PRIVATE.search(line)]
    assert found == []


def test_generation_config_and_special_tokens():
    model = tiny_model("llama")
    config, rest = compat.prepare_generation_config(model, GenerationConfig(max_new_tokens=3), do_sample=False,
                                                    attention_mask=None)
    assert config.max_new_tokens == 3 and config.do_sample is False and "attention_mask" in rest
    config.eos_token_id = 2
    compat.prepare_special_tokens(model, config, torch.device("cpu"))
    assert torch.equal(config._eos_token_tensor, torch.tensor([2]))


def test_stock_criteria_and_processors():
    model = tiny_model("llama")
    config, _ = compat.prepare_generation_config(model, GenerationConfig(max_length=9, eos_token_id=2,
                                                                         do_sample=True, temperature=0.5))
    compat.prepare_special_tokens(model, config, torch.device("cpu"))
    criteria = compat.stock_stopping_criteria(model, config, StoppingCriteriaList(), None)
    assert {type(c) for c in criteria} == {MaxLengthCriteria, EosTokenCriteria}
    processors = compat.stock_logits_processors(model, config, 4, LogitsProcessorList(), torch.device("cpu"))
    assert any(isinstance(p, TemperatureLogitsWarper) and p.temperature == 0.5 for p in processors)


def test_attn_implementation_round_trip():
    config = tiny_model("llama").config
    assert compat.has_attn_implementation(config)
    own = compat.get_attn_implementation(config)
    compat.set_attn_implementation(config, "eager")
    assert config._attn_implementation == "eager"
    compat.set_attn_implementation(config, own)
    assert compat.get_attn_implementation(config) == own


def test_hooks_are_seen():
    layer = torch.nn.Linear(2, 2)
    assert not compat.module_is_hooked(layer)
    handle = layer.register_forward_hook(lambda *a: None)
    assert compat.module_is_hooked(layer)
    handle.remove()
    layer.compile()
    assert compat.module_is_hooked(layer)
    assert not compat.global_forward_hooks()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert compat.global_forward_hooks()
    finally:
        handle.remove()


def test_numba_cache_index(tmp_path, monkeypatch):
    import numba

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))

    def double(x):
        return x * 2

    source = tmp_path / "mod.py"
    source.write_text("from numba import njit\n@njit(cache=True)\ndef double(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("mod")
    assert compat.numba_cache_index(module.double) == {}
    assert module.double(3) == 6
    index = compat.numba_cache_index(module.double)
    assert len(index) == 1 and next(iter(index))[0] == (numba.int64,)
    assert compat.numba_cache_index(double) == {}  # not a dispatcher: "not cached", no error


def _tokenizers() -> dict:
    """Fast tokenizers of four kinds: byte-level without clean-up, GPT-2's (clean-up on, a BPE model: skipped), a
    SentencePiece-style one (byte fallback, a decoder that strips a leading space), a WordPiece one (clean-up on)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.programs.test_a_tokenizer_that_strips_the_leading_space import _llama2_like_tokenizer
    from tests.tiny_models import byte_tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # GPT-2's shape: byte-level BPE, a few merges, clean-up on
    vocab = {ch: i for i, ch in enumerate(alphabet)} | {"Ġh": 256, "Ġhe": 257, "ll": 258, "Ġhell": 259, "<|endoftext|>": 260}
    byte_bpe = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "h"), ("Ġh", "e"), ("l", "l"), ("Ġhe", "ll")]))
    byte_bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_bpe.decoder = decoders.ByteLevel()
    gpt2 = PreTrainedTokenizerFast(tokenizer_object=byte_bpe, eos_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=True)
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "[CLS]": 1, "hello": 2, "world": 3, "##s": 4, ",": 5, "!": 6},
                                           unk_token="[UNK]"))
    wordpiece.normalizer, wordpiece.pre_tokenizer = normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece()
    bert = PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]", cls_token="[CLS]",
                                   clean_up_tokenization_spaces=True)
    return {"bytes": byte_tokenizer(), "gpt2": gpt2, "sentencepiece": _llama2_like_tokenizer(), "wordpiece": bert}


def test_plain_decoder_decodes_what_decode_decodes():
    import random

    rng = random.Random(0)
    taken = {}
    for name, tok in _tokenizers().items():
        backend = compat.plain_decoder(tok)
        taken[name] = backend is not None
        size = len(tok)
        for _ in range(300):
            ids = [rng.randrange(size) for _ in range(rng.randrange(0, 12))]
            for skip in (False, True):
                expected = tok.decode(ids, skip_special_tokens=skip)
                assert (backend.decode(ids, skip_special_tokens=skip) if backend else expected) == expected
    # the fast path where decode runs nothing else; not where it cleans up spaces (WordPiece: "hello , world")
    assert taken == {"bytes": True, "gpt2": True, "sentencepiece": True, "wordpiece": False}
    patched = _tokenizers()["bytes"]
    patched.decode = lambda ids, **kw: "patched"  # an override on the object: decode is what the caller set
    assert compat.plain_decoder(patched) is None
