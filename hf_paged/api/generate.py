"""The patched `generate` and `generate_batch` of a wrapped model.

`generate`: each row of `input_ids` (padding stripped by `attention_mask`) becomes a request; the engine runs
them; the result is assembled exactly as stock `generate` returns it (left padding kept, finished rows padded with
`pad_token_id`, `return_dict_in_generate`, `output_scores`, `streamer`). Assisted decoding
(`prompt_lookup_num_tokens=k`, `assistant_model=draft`) runs as the engine's speculative decoding, batched. Modes
the engine does not implement fall back to stock `generate` with a one-line warning.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteriaList

from hf_paged.api.autocast import refuse_mixed_precision_forward
from hf_paged.api.generate_criteria import LockstepCriteria
from hf_paged.api.generate_fallback import dropout_active, fallback_reason
from hf_paged.api.generate_inputs import (
    check_priorities,
    check_prompts,
    checked_inputs,
    masked_after_start,
    per_input_params,
)
from hf_paged.api.generate_output import StreamEnd, assemble_generate_output, incomplete_rows, make_streamer_hook
from hf_paged.api.generate_processors import ProcessorFactory
from hf_paged.batching.request import RequestOutput, RequestStatus, fork_ids
from hf_paged.batching.sampling import MAX_SPECULATIVE_TOKENS, SamplingParams, as_list
from hf_paged.batching.stock_batch import StockBatch
from hf_paged.cache.sizing import length_dependent_rope, windowed_attention
from hf_paged.compat import (
    execution_device,
    has_default_max_length,
    prepare_generation_config,
    prepare_special_tokens,
    stock_max_length,
    stock_stopping_criteria,
)
from hf_paged.errors import HfPagedError, InvalidPromptError, RequestFailedError


class PagedFallbackWarning(UserWarning):
    """`generate` was asked for something the paged engine does not do, and ran stock `generate` instead."""


class IncompleteDocumentWarning(UserWarning):
    """Some rows of a constrained `generate` reached `max_new_tokens` before their document was complete (JSON
    schema, regex, choices, grammar): their text will not parse. `generate_batch` says it per request
    (`finish_reason == "length_incomplete"`)."""


class RightPaddingWarning(UserWarning):
    """`generate` got right-padded rows: each is continued after its last real token (as left padding would give),
    where stock continues after the padding (and logs that its results will be wrong)."""


class PositionLimitWarning(UserWarning):
    """`generate` was asked for more tokens than the model's positions hold (`max_position_embeddings`): rows stop
    there (`generate_batch`: `finish_reason == "length"`), shorter than stock's output, which runs past them."""


def paged_generate(model, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None,
                   logits_processor=None, stopping_criteria=None, prefix_allowed_tokens_fn=None, synced_gpus=None,
                   assistant_model=None, streamer=None, negative_prompt_ids=None, negative_prompt_attention_mask=None,
                   custom_generate=None, **kwargs: Any):
    """Stock `generate` signature, run on the paged engine. See the module docstring."""
    stock = type(model).generate.__get__(model)
    # the streamer's one end(), also when the call raises (a check, a put, a processor, Ctrl-C), so that a
    # TextIteratorStreamer's reader is not left waiting; not after handing the call to stock, which ends it itself
    stream = StreamEnd(streamer)
    try:
        return _paged_generate(model, stock, stream, inputs, generation_config, logits_processor, stopping_criteria,
                               prefix_allowed_tokens_fn, synced_gpus, assistant_model, negative_prompt_ids,
                               negative_prompt_attention_mask, custom_generate, kwargs)
    finally:
        stream.end()


def _paged_generate(model, stock, stream: StreamEnd, inputs, generation_config, logits_processor, stopping_criteria,
                    prefix_allowed_tokens_fn, synced_gpus, assistant_model, negative_prompt_ids,
                    negative_prompt_attention_mask, custom_generate, kwargs: dict[str, Any]):
    from hf_paged.api.wrap_state import engine_of

    streamer = stream.streamer
    extra = {"stopping_criteria": stopping_criteria, "prefix_allowed_tokens_fn": prefix_allowed_tokens_fn,
             "synced_gpus": synced_gpus, "assistant_model": assistant_model, "custom_generate": custom_generate}
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    if input_ids is None or "inputs_embeds" in kwargs or kwargs.get("cache") is not None \
            or kwargs.get("past_key_values") is not None or negative_prompt_ids is not None:
        return _fallback(stock, "inputs_embeds / an explicit cache / no input_ids", inputs, generation_config,
                         logits_processor, stream.to_stock(), extra, kwargs, negative_prompt_ids,
                         negative_prompt_attention_mask)
    own = sorted(_OWN_KEYWORDS & set(kwargs))
    if own:  # stock would refuse them as unused model kwargs, after a fallback warning
        raise ValueError(f"{own} are generate_batch options (one output per request, with its attempts); generate "
                         "returns tensors: call model.generate_batch(prompts, ..., constraint_mode=..., "
                         "max_retries=...) instead")
    default_max_length = has_default_max_length(model, generation_config, kwargs)
    gen_config, model_kwargs = prepare_generation_config(model, generation_config, **kwargs)
    reason = fallback_reason(model, gen_config, model_kwargs,
                             {**extra, "streamer": streamer, "logits_processor": logits_processor}, len(input_ids))
    if reason is not None:
        return _fallback(stock, reason, input_ids, generation_config, logits_processor, stream.to_stock(), extra,
                         kwargs, negative_prompt_ids, negative_prompt_attention_mask)

    input_ids, attention_mask = checked_inputs(input_ids, model_kwargs.get("attention_mask"), gen_config.pad_token_id,
                                               as_list(gen_config.eos_token_id))
    right_padded, holes = masked_after_start(attention_mask)
    if (right_padded or holes) and windowed_attention(model.config):
        return _fallback(stock, f"attention_mask rows {(holes or right_padded)[:8]} have zeros after their first token "
                         "on a model with sliding-window layers (stock's window counts the masked slots)", input_ids,
                         generation_config, logits_processor, stream.to_stock(), extra, kwargs, negative_prompt_ids,
                         negative_prompt_attention_mask)
    if right_padded:
        warnings.warn(f"hf_paged: rows {right_padded[:8]} are right-padded; each is continued after its last real "
                      "token (what left padding gives), where stock generate continues after the padding; for output "
                      "identical to stock, pad on the left (tokenizer.padding_side = 'left')", RightPaddingWarning,
                      stacklevel=3)
    prompts = [row[mask.bool()].tolist() for row, mask in zip(input_ids.cpu(), attention_mask.cpu())]
    engine = engine_of(model)
    padded_len = input_ids.shape[1]
    max_new_tokens = gen_config.max_new_tokens
    if max_new_tokens is None:  # stock's length: 20 new tokens by default, a prompt past max_length its ValueError
        max_new_tokens = stock_max_length(model, gen_config, default_max_length, padded_len) - padded_len
    longest = max((len(p) for p in prompts), default=0)
    rope = length_dependent_rope(model.config)
    if longest + max_new_tokens > engine.max_model_len and rope is not None:
        return _fallback(stock, f"{rope} rotary frequencies past the model's {engine.max_model_len} positions (they "
                         "change with the sequence's length there)", input_ids, generation_config,
                         logits_processor, stream.to_stock(), extra, kwargs, negative_prompt_ids,
                         negative_prompt_attention_mask)
    check_prompts(engine, prompts, max_new_tokens)
    # rows end at the model's positions, a prompt of all of them after its one token (valid in stock too); stock goes
    # on past them (with a logged reminder)
    if longest + max_new_tokens > max(engine.max_model_len, longest + 1):
        warnings.warn(f"hf_paged: generation stops at the model's maximum of {engine.max_model_len} positions (a "
                      f"prompt of {longest} tokens + max_new_tokens={max_new_tokens}); rows that reach it end there, "
                      "where stock generate would go on past the positions the model was trained on",
                      PositionLimitWarning, stacklevel=3)

    eos = as_list(gen_config.eos_token_id)
    pad_token_id = gen_config.pad_token_id if gen_config.pad_token_id is not None else (eos[0] if eos else 0)
    factory = ProcessorFactory(model, gen_config, logits_processor, input_ids.device)
    num_seqs = gen_config.num_return_sequences or 1
    # stop strings, max_time and the caller's criteria run as stock's own list (LockstepCriteria), not in the engine
    lockstep = bool(stopping_criteria) or gen_config.stop_strings is not None or gen_config.max_time is not None
    params = _params_per_prompt(gen_config, factory, prompts, padded_rows=input_ids.tolist(),
                                left_pads=attention_mask.ne(0).int().argmax(dim=1).tolist(),
                                max_new_tokens=max_new_tokens, eos_token_id=eos or None, stop_strings=None,
                                **speculative_params(gen_config, assistant_model))
    rows = input_ids.repeat_interleave(num_seqs, dim=0)
    criteria = _stock_criteria(model, gen_config, stopping_criteria, model_kwargs.get("tokenizer"), padded_len,
                               max_new_tokens, input_ids.device) if lockstep else None
    submission = engine.loop.submit(prompts, params, stream=streamer is not None or lockstep)
    if streamer is not None:  # stock puts the expanded rows (a put that raises: the ids go back once collected)
        streamer.put(rows.cpu())
    assisted = len(rows) == 1 and (assistant_model is not None or bool(gen_config.prompt_lookup_num_tokens))
    on_step = make_streamer_hook(streamer, submission.all_ids, pad_token_id, assisted=assisted)
    replay = None
    if criteria is not None:
        replay = LockstepCriteria(criteria, rows, submission.all_ids, pad_token_id, max_new_tokens,
                                  lambda ids: engine.loop.abort(*ids, forks=False), sync=engine.sampler.sync,
                                  scores_vocab=factory.vocab_size if gen_config.return_dict_in_generate
                                  and gen_config.output_scores else None)
        on_step = replay.on_step
    # sampled: rows that ended still take their draws, as in stock's batch (stock_batch.py)
    stock = StockBatch.register(engine.sampler.stock_batches, submission.all_ids if gen_config.do_sample else ())
    try:
        outputs = submission.result(on_step)
    finally:
        stock.unregister()
        stream.end()  # (before the outputs are shaped: the reader's loop ends with the last token)
    failed = [o for o in outputs.values() if o.status is RequestStatus.FAILED
              and not (replay is not None and o.request_id in replay.aborted)]
    if failed:
        raise failure_error(failed[0])
    ordered = list(outputs.values())
    if replay is not None:
        ordered = [replace(o, generated_tokens=replay.cut(i, list(o.generated_tokens)),
                           scores=o.scores and replay.cut(i, o.scores), logits=o.logits and replay.cut(i, o.logits))
                   for i, o in enumerate(ordered)]
    for message in incomplete_rows(ordered, gen_config.max_new_tokens):
        warnings.warn(message, IncompleteDocumentWarning, stacklevel=3)
    return assemble_generate_output(rows, ordered, gen_config, pad_token_id, factory.vocab_size,
                                    scores=[o.scores or [] for o in ordered], logits=[o.logits or [] for o in ordered])


def _stock_criteria(model, gen_config: GenerationConfig, stopping_criteria, tokenizer, padded_len: int,
                    max_new_tokens: int, device) -> StoppingCriteriaList:
    """The `StoppingCriteriaList` stock `generate` would build for this call (its length, `max_time`, stop strings
    and EOS criteria merged with the caller's, as stock merges them)."""
    config = copy.deepcopy(gen_config)
    config.max_length = padded_len + max_new_tokens
    prepare_special_tokens(model, config, device)
    return stock_stopping_criteria(model, config, StoppingCriteriaList(stopping_criteria or []), tokenizer)


def failure_error(output: RequestOutput) -> HfPagedError:
    """The exception `generate` raises for a request that ended FAILED: of the class its output carries
    (`RequestOutput.error_type`) when that is one of our typed errors (`hf_paged.errors`: a schema the constraint
    cannot compile, a draft model of another tokenizer, a request the pool can never hold...), else
    `RequestFailedError` (the message names the original class: a user processor's exception, an abort)."""
    message = f"request {output.request_id} failed: {output.error}"
    error_type = output.error_type
    if error_type is not None and issubclass(error_type, HfPagedError):
        try:
            return error_type(message)
        except TypeError:  # a subclass whose constructor wants more than a message
            pass
    return RequestFailedError(message)


def speculative_params(gen_config: GenerationConfig, assistant_model=None) -> dict[str, Any]:
    """`SamplingParams` fields of stock assisted decoding: `prompt_lookup_num_tokens` (and
    `max_matching_ngram_size`), or `assistant_model` drafting `num_assistant_tokens` a step (stock's default 20,
    capped at `MAX_SPECULATIVE_TOKENS`; the count stays fixed: stock's adaptive schedules are not followed)."""
    if assistant_model is not None:
        k = gen_config.num_assistant_tokens or getattr(assistant_model.generation_config, "num_assistant_tokens", None)
        return {"num_speculative_tokens": min(int(k or 20), MAX_SPECULATIVE_TOKENS), "draft_model": assistant_model}
    if gen_config.prompt_lookup_num_tokens:
        params: dict[str, Any] = {
            "num_speculative_tokens": min(int(gen_config.prompt_lookup_num_tokens), MAX_SPECULATIVE_TOKENS)}
        if gen_config.max_matching_ngram_size:
            params["prompt_lookup_max_ngram"] = int(gen_config.max_matching_ngram_size)
        return params
    return {}


def _fallback(stock, reason, inputs, generation_config, logits_processor, streamer, extra, kwargs,
              negative_prompt_ids, negative_prompt_attention_mask):
    warnings.warn(f"hf_paged: {reason} is not supported by the paged engine; running stock generate",
                  PagedFallbackWarning, stacklevel=4)
    return stock(inputs, generation_config, logits_processor=logits_processor, streamer=streamer,
                 negative_prompt_ids=negative_prompt_ids, negative_prompt_attention_mask=negative_prompt_attention_mask,
                 **{k: v for k, v in extra.items() if v is not None}, **kwargs)


def paged_generate_batch(model, inputs: list[list[int]], generation_config: GenerationConfig | None = None,
                         continuous_batching_config=None, record_timestamps: bool = False, progress_bar: bool = False,
                         persistent_manager: bool = False, warmup: bool = True, *,
                         logits_processor=None, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                         priorities: Sequence[int] | None = None, distributed: bool = False,
                         **kwargs: Any) -> dict[str, RequestOutput]:
    """transformers' `generate_batch` signature on the paged engine; returns `{request_id: RequestOutput}` in input
    order (`req_0`, `req_1`, ...; forks of `num_return_sequences` as `req_0__child#0`, ... after their parent).

    Beyond transformers: `logits_processor=` (applied per request with its own history), `sampling_params=` (one
    `SamplingParams` for all, or one per input), `priorities=` (higher first), `distributed=True` (under torchrun /
    accelerate: every rank passes the same inputs, generates its shard, and gets every output;
    `hf_paged.distributed.generate_batch`). `record_timestamps=True` fills each output's `timestamps` (as
    transformers'). `continuous_batching_config`, `persistent_manager`, `warmup`: ignored (the engine persists).

    Raises `InvalidPromptError` before any work when an input is not token ids of this model (empty, negative or
    outside the vocabulary); `UnsupportedGenerationError` for a forward accelerate wrapped in autocast (the engine
    computes in the weights' dtype, with `torch.autocast` off: `api/autocast.py`). Other per-request failures
    (a prompt beyond the positions or the pool, a processor that raised) end it `FAILED` with `error`; others run."""
    from hf_paged.api.generate_inputs import token_ids_of
    from hf_paged.api.wrap_state import engine_of
    from hf_paged.batching.progress import progress_hook

    if distributed:  # each rank generates its shard through this same method (without `distributed`)
        from hf_paged.distributed import generate_batch as distributed_generate_batch

        return distributed_generate_batch(model, inputs, generation_config, logits_processor=logits_processor,
                                          sampling_params=sampling_params, priorities=priorities,
                                          progress_bar=progress_bar, record_timestamps=record_timestamps, **kwargs)
    if isinstance(inputs, torch.Tensor):
        raise InvalidPromptError("generate_batch takes a list of token-id lists, not a tensor (a tensor's rows may "
                                 "hold padding): pass e.g. [row[mask.bool()].tolist() for row, mask in "
                                 "zip(input_ids, attention_mask)]")
    if not inputs:
        return {}
    if model.training and dropout_active(model):
        warnings.warn("hf_paged: the model is in training mode with dropout, which generate_batch does not apply "
                      "(it runs the model as in eval mode); call model.eval() first to silence this", stacklevel=2)
    refuse_mixed_precision_forward(model, "generate_batch")
    engine = engine_of(model)
    prompts = token_ids_of(engine, inputs)
    if priorities is not None:
        check_priorities(priorities, len(prompts))
    per_request = sampling_params_for(model, prompts, generation_config, logits_processor, sampling_params, kwargs)
    if record_timestamps:  # transformers' GenerationOutput.timestamps: one time per generated token
        per_request = [p.replace(record_timestamps=True) for p in per_request]
    # Engine ids are unique across concurrent callers; this call's outputs are renamed req_0, req_1, ... as
    # transformers names them.
    submission = engine.loop.submit(prompts, per_request, priorities=priorities, stream=progress_bar)
    names = [c for i, p in enumerate(per_request) for c in fork_ids(f"req_{i}", p.num_return_sequences)]
    with progress_hook(engine, len(names), enabled=progress_bar) as on_step:
        outputs = submission.result(on_step)
    renamed = {}
    for name, output in zip(names, outputs.values()):
        output.request_id = name
        renamed[name] = output
    return renamed


# generate_batch keywords beyond GenerationConfig's fields: hf_paged's own (`SamplingParams.from_generation_config`)
_OWN_KEYWORDS = frozenset({"constraint_mode", "max_retries"})


def sampling_params_for(model, inputs, generation_config, logits_processor, sampling_params, kwargs):
    """One `SamplingParams` per input from `generate_batch`'s options: the one translation its callers share."""
    if sampling_params is not None:
        also = [name for name, given in (("generation_config", generation_config is not None),
                                         ("logits_processor", bool(logits_processor))) if given] + sorted(kwargs)
        if also:  # they would be ignored: a processor dropped silently is an unconstrained answer
            raise ValueError(f"generate_batch got sampling_params and also {also}; put those options in the "
                             "SamplingParams (e.g. logits_processors=, max_new_tokens=) instead")
        return per_input_params(sampling_params, len(inputs))
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        hint = " (GenerationConfig(**that_dict), or its fields as keywords)" if isinstance(generation_config, dict) else ""
        raise TypeError("generation_config must be a transformers GenerationConfig, got "
                        f"{type(generation_config).__name__}{hint}")
    gen_config = generation_config if generation_config is not None else model.generation_config
    max_new_tokens = kwargs.pop("max_new_tokens", None)
    assistant_model = kwargs.pop("assistant_model", None)
    tokenizer = kwargs.pop("tokenizer", None)  # for stop strings, as transformers takes it (not a config field)
    unknown = sorted(set(kwargs) - set(GenerationConfig().to_dict()) - set(gen_config.to_dict()) - _OWN_KEYWORDS)
    if unknown:  # a typo (max_new_token=) would otherwise run with the defaults
        raise ValueError(f"generate_batch got unknown keyword argument(s) {unknown}: neither GenerationConfig fields "
                         f"nor hf_paged's ({', '.join(sorted(_OWN_KEYWORDS))}); check the spelling")
    _refuse_unread_limits(kwargs, generation_config, max_new_tokens, model.generation_config)
    if kwargs:
        gen_config = GenerationConfig.from_dict({**gen_config.to_dict(), **kwargs})
    factory = ProcessorFactory(model, gen_config, logits_processor, execution_device(model))
    overrides: dict[str, Any] = {"max_new_tokens": max_new_tokens} if max_new_tokens is not None else {}
    if tokenizer is not None:
        overrides["tokenizer"] = tokenizer
    if assistant_model is not None:  # not a GenerationConfig field: an argument, as in stock generate
        overrides.update(speculative_params(gen_config, assistant_model))
    room = None
    if max_new_tokens is None and gen_config.max_new_tokens is None:
        # transformers' generate_batch: no max_new_tokens is no limit (max_length is not read), so a request runs to
        # EOS or, here, to the model's positions (not SamplingParams' default of 20)
        from hf_paged.api.wrap_state import engine_of

        room = engine_of(model).max_model_len
    return _params_per_prompt(gen_config, factory, inputs, room=room, **overrides)


def _refuse_unread_limits(kwargs: dict, generation_config: GenerationConfig | None, max_new_tokens,
                          model_config: GenerationConfig) -> None:
    """`max_time` and `max_length`, which `generate_batch` does not read (nor does transformers' own): a limit the
    caller named must not be dropped silently (found by hostile passes: 2,000 tokens for max_time=0.2, the model's
    positions for max_length=12 as a keyword, in `generation_config=` or in `model.generation_config`)."""
    if kwargs.get("max_time") is not None or (generation_config is not None and generation_config.max_time is not None):
        raise ValueError("generate_batch got max_time: it runs each request to its own end (transformers' "
                         "generate_batch ignores max_time too); bound each with max_new_tokens, or use "
                         "model.generate(..., max_time=) for a time limit")
    why = ("it counts each request's new tokens, not prompt plus output (transformers' generate_batch does not read "
           "max_length either); give max_new_tokens")
    if kwargs.get("max_length") is not None and max_new_tokens is None:
        raise ValueError(f"generate_batch got max_length={kwargs['max_length']}: {why}")
    config, name = (model_config, "model.generation_config") if generation_config is None else \
        (generation_config, "generation_config")
    if config.max_length is not None and max_new_tokens is None and config.max_new_tokens is None:
        # a warning, not an error: checkpoints ship max_length in generation_config.json (Llama 2: 4096), and a
        # drop-in for transformers' generate_batch, which ignores it, must run their configs
        warnings.warn(f"generate_batch does not read {name}.max_length={config.max_length}: {why}, or set "
                      f"{name}.max_length = None to silence this; each request runs to EOS or the model's positions",
                      PositionLimitWarning, stacklevel=4)


def _params_per_prompt(gen_config: GenerationConfig, factory: ProcessorFactory, prompts, padded_rows=None,
                       left_pads=None, room: int | None = None, **overrides: Any) -> list[SamplingParams]:
    """The one translation of a `GenerationConfig` for the engine (`generate` and `generate_batch` alike): its
    options (`SamplingParams.from_generation_config`), and stock's processor list. That list holds stock's warpers
    (temperature, top-k, top-p) and `min_new_tokens`' EOS suppression in stock's order, so the sampler must not
    apply them again.
    - `generate` (`padded_rows`: its input_ids, `left_pads`: each row's leading padding): stock's list for the
      padded batch, each row's processors reading the row as stock's do (`processor_prompt_ids`, its padding
      included; the repetition penalty skipping the leading pads as stock's does);
    - `generate_batch`: each prompt with stock's list for that prompt alone, from the config as given (as
      transformers' own `generate_batch`: no default top-k of 50 is added to a sampled config that names none,
      which stock `generate` adds), `room`: no limit was given, generate up to the model's `room` positions."""
    base = SamplingParams.from_generation_config(gen_config, stock_processors=True, **overrides)
    plain = {"temperature": 1.0, "top_k": None, "top_p": 1.0}
    if padded_rows is not None:
        params = [base.replace(logits_processors=factory.for_prompt_length(len(row), base.max_new_tokens, pads),
                               processor_prompt_ids=row, **plain) for row, pads in zip(padded_rows, left_pads)]
    else:
        params = []
        for prompt in prompts:
            new = base.max_new_tokens if room is None else max(room - len(prompt), 1)
            params.append(base.replace(logits_processors=factory.for_prompt_length(len(prompt), new),
                                       max_new_tokens=new, **plain))
    if base.min_new_tokens:  # stock's list holds EOS back, before its warpers (checked above against constraints);
        params = [p.replace(min_new_tokens=0) for p in params]  # the sampler's own would act after them
    return params
