"""Families `wrap` refuses because the paged attention would give other tokens than stock (or crash), found by a
sweep of every causal-LM type of transformers 5.25 on tiny random models (the h52 pass): attention sinks, a learned
dynamic mask, attention called twice a layer, layers reused across cycles, inline attention, positions from the
cache's length, a forward without `logits_to_keep`. Each is refused with the reason, at `wrap`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_paged
from hf_paged.errors import UnsupportedModelError

# attribute -> tiny value, set where the type's default config has the attribute
_DIMS = {
    "hidden_size": 64, "d_model": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "decoder_layers": 2, "encoder_layers": 2, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4, "decoder_ffn_dim": 128, "encoder_ffn_dim": 128, "vocab_size": 128,
    "max_position_embeddings": 128, "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
    "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "dff": 128, "sliding_window": 8,
}


def tiny(model_type: str, **overrides) -> torch.nn.Module:
    base = AutoConfig.for_model(model_type)
    kwargs = {k: v for k, v in _DIMS.items() if isinstance(getattr(base, k, None), int)} | overrides
    kwargs |= {k: 2 for k, v in base.to_dict().items() if k.endswith("_token_id") and isinstance(v, int) and v >= 128}
    if isinstance(getattr(base, "layer_types", None), list):
        kwargs["layer_types"] = list(base.layer_types[: kwargs.get("num_hidden_layers", 2)])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs)).eval()


@pytest.mark.parametrize(("model_type", "reason"), [
    ("gpt_oss", "attention sinks"),
    ("doge", "dynamic mask"),
    ("diffllama", "twice"),
    ("hrm_text", "several times per token"),
    ("marian", "positions from the cache's length"),
    ("pegasus", "positions from the cache's length"),
    ("ctrl", "without the attention kwargs"),
    ("whisper", "no logits_to_keep"),
])
def test_families_the_paged_attention_would_get_wrong_are_refused(model_type, reason):
    model = tiny(model_type)
    with pytest.raises(UnsupportedModelError, match=reason):
        hf_paged.wrap(model)
    assert "generate" not in vars(model) and "_hf_paged" not in vars(model)  # left as it was
    # an engine built directly (as `hf-paged serve` and the replicas build theirs) refuses it too: it built one
    # before and failed its first step with a KeyError from the pool (GPT-NeoX), or ran the wrong attention
    with pytest.raises(UnsupportedModelError, match=reason):
        hf_paged.Engine(model)


def test_families_with_their_features_still_run():
    """Soft-capping, sliding windows, MoE: wrapped, and greedy as stock (the sweep's passing side)."""
    for model_type in ("gemma2", "mixtral", "qwen3"):
        model = tiny(model_type)
        ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1))
        want = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
        hf_paged.wrap(model)
        try:
            got = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
        finally:
            hf_paged.unwrap(model)
        assert torch.equal(got, want), model_type


def test_a_layer_that_calls_the_paged_attention_twice_in_a_step_fails_loudly(monkeypatch):
    """The safety net under the refusals: a family no one listed that calls its attention twice per layer (as
    DiffLlama does) fails its requests with the reason instead of reading overwritten values."""
    from hf_paged.cache import model_support

    model = tiny("diffllama")
    monkeypatch.setattr(model_support, "_UNSUPPORTED_MODEL_TYPES", {})
    hf_paged.wrap(model)
    try:
        with pytest.raises(UnsupportedModelError, match="called the paged attention twice in one forward"):
            model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    finally:
        hf_paged.unwrap(model)


def test_a_tensor_the_paged_attention_would_drop_fails_loudly(monkeypatch):
    """Under the sinks refusal: an attention function handed a tensor it does not apply (gpt-oss's `s_aux`) fails
    the request naming it, instead of attending without it."""
    from hf_paged.api import wrapping
    from hf_paged.batching import engine

    model = tiny("gpt_oss")
    for module in (wrapping, engine):  # past the refusal by its sinks
        monkeypatch.setattr(module, "check_supported", lambda m: None)
    hf_paged.wrap(model)
    try:
        with pytest.raises(UnsupportedModelError, match=r"passes \['s_aux'\] to its attention function"):
            model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    finally:
        hf_paged.unwrap(model)


def test_a_float64_model_is_refused_at_wrap():
    """A float64 model was wrapped, then every request failed in the kernels ("key_cache must have dtype float16,
    bfloat16, float32"), on the torch backend too: refused at wrap, naming the fix."""
    from tests.tiny_models import tiny_model

    model = tiny_model("llama").double()
    with pytest.raises(UnsupportedModelError, match=r"is in torch\.float64: .*model\.float\(\)"):
        hf_paged.wrap(model)
    with pytest.raises(UnsupportedModelError, match=r"is in torch\.float64"):  # `hf-paged serve --dtype auto`
        hf_paged.Engine(model)
    assert "generate" not in model.__dict__  # left as it was
    hf_paged.unwrap(hf_paged.wrap(model.float()))  # the same model in float32 runs
