"""Tiny random models of each supported family, built from configs (no hub)."""

from __future__ import annotations

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from hf_paged.cli.workloads import left_pad  # noqa: F401  (re-exported for the tests)

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=None, pad_token_id=0)
DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, **COMMON)

FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**DECODER)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**DECODER)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(sliding_window=24, **DECODER)),
    "gemma": lambda: GemmaForCausalLM(GemmaConfig(head_dim=8, **DECODER)),
    # soft-capped attention scores, a sliding layer beside a full one (and the scale Gemma 2 takes from
    # query_pre_attn_scalar)
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(head_dim=8, sliding_window=24, attn_logit_softcapping=2.0,
                                                     query_pre_attn_scalar=12, **DECODER)),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=512, **COMMON)),
    "phi3": lambda: Phi3ForCausalLM(Phi3Config(**DECODER)),
}


def tiny_model(family: str = "llama", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = FAMILIES[family]().eval()
    model.config._attn_implementation = "eager" if family == "gemma2" else "sdpa"  # (sdpa has no soft-capping)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def ragged_prompts(lengths, seed: int = 1, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def run_engine(engine, prompts, max_new_tokens, *, pool_empty: bool = False) -> list[list[int]]:
    """Run `prompts` through `engine` to the end (`max_new_tokens`: one int, or one per prompt), checking its
    integrity after every step and that no request failed (with `pool_empty`, that every block came back)."""
    from hf_paged import SamplingParams

    news = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, news, strict=True)]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs), [o.error for o in outs]
    if pool_empty:
        assert engine.cache.pool.num_used_blocks == 0
    return [o.generated_tokens for o in outs]


def stock_greedy(model, prompts, max_new_tokens: int, **kwargs) -> list[list[int]]:
    """Reference continuations: stock generate, one prompt at a time (no padding at all)."""
    outs = []
    for p in prompts:
        out = model.generate(torch.tensor([p], device=model.device),
                             attention_mask=torch.ones(1, len(p), dtype=torch.long, device=model.device),
                             max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
        outs.append(out[0, len(p):].tolist())
    return outs


def byte_tokenizer():
    """A byte-level tokenizer (256 byte tokens + <eos>), built offline with the `tokenizers` library."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_to_unicode = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_to_unicode))}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
