"""When the patched `generate` runs stock `generate` instead of the engine (`PagedFallbackWarning`): the modes and
arguments whose answer the engine would not give as stock gives it."""

from __future__ import annotations

from transformers import GenerationConfig

from hf_paged.api.autocast import autocast_reason
from hf_paged.batching.constraint_protocol import is_constraint
from hf_paged.batching.sampling import unsupported_modes
from hf_paged.compat import compiled_in_place
from hf_paged.errors import UnsupportedGenerationError

# generate() arguments (besides generation options) the engine understands; `labels` (Seq2SeqTrainer's
# predict_with_generate passes them) only make stock's forwards compute a loss nobody reads: ignored.
_ENGINE_MODEL_KWARGS = {"attention_mask", "use_cache", "tokenizer", "labels"}


def fallback_reason(model, generation_config: GenerationConfig, kwargs: dict, extra: dict, rows: int) -> str | None:
    modes = unsupported_modes(generation_config)
    if modes:
        return modes[0]
    assisted = extra.get("assistant_model") is not None or bool(generation_config.prompt_lookup_num_tokens)
    if assisted:
        from hf_paged.api.wrap_state import engine_of

        reason = engine_of(model).speculator.unsupported
        if reason is not None and rows > 1:  # stock's assisted decoding takes one row: it would raise its own error
            raise UnsupportedGenerationError(
                f"assisted decoding (prompt_lookup_num_tokens / assistant_model) of {rows} rows: the paged engine's "
                f"speculative decoding {reason}, and stock generate's assisted decoding takes one row at a time; "
                "generate one row per call, or drop the assistant")
        if reason is not None:
            return f"assisted decoding (speculative decoding {reason})"
    stops = (extra.get("stopping_criteria") or generation_config.stop_strings is not None
             or generation_config.max_time is not None)
    if stops and extra.get("streamer") is not None:
        return "stopping criteria with a streamer"  # (replayed criteria may cut back tokens already streamed)
    if stops and assisted and rows == 1:  # (stock's assisted decoding takes one row: more run on the engine alone)
        return "stopping criteria with assisted decoding (stock checks them once per accepted draft, not per token)"
    if (generation_config.min_new_tokens or generation_config.min_length) \
            and any(is_constraint(p) for p in extra.get("logits_processor") or ()):
        # (the engine refuses it, as EOS held back past a document's end leaves nothing allowed; stock runs it, and
        # a minimum below the document's shortest length changes nothing there: h9)
        return "min_new_tokens / min_length beside a constrained logits processor"
    if extra.get("prefix_allowed_tokens_fn") is not None:
        return "prefix_allowed_tokens_fn"
    if extra.get("custom_generate") is not None or extra.get("synced_gpus"):
        return "custom_generate / synced_gpus"
    if generation_config.output_attentions or generation_config.output_hidden_states:
        return "output_attentions / output_hidden_states"
    if getattr(generation_config, "token_healing", False):
        return "token healing"
    if model.training and dropout_active(model):
        return "a model in training mode with dropout (stock generate applies it; call model.eval() for the engine)"
    if any(compiled_in_place(m) for m in model.modules()):
        return "a model compiled in place (module.compile() or forward = torch.compile(forward))"
    other = sorted(k for k, v in kwargs.items() if k not in _ENGINE_MODEL_KWARGS and v is not None)
    if other:
        return f"model inputs {other}"
    return autocast_reason(model)  # (api/autocast.py: the engine does not follow autocast)


def dropout_active(model) -> bool:
    """A dropout module with p > 0, or an attention module that drops attention weights in training mode."""
    return any((type(m).__name__.endswith("Dropout") and getattr(m, "p", 0) > 0)
               or (isinstance(rate := getattr(m, "attention_dropout", None), (int, float)) and rate > 0)
               for m in model.modules())
