"""Checks of what a caller passes to the patched `generate` / `generate_batch`, before any work: a typed error that
names the argument and the fix, never a tensor error from deep inside nor an input read silently another way."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import torch

from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import InvalidPromptError

__all__ = ["check_priorities", "check_prompts", "checked_inputs", "per_input_params", "token_ids_of"]


def checked_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, pad_token_id: int | None = None,
                   eos_token_ids: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """`input_ids` and `attention_mask` as [batch, length] tensors of the same shape (a 1-D row is one prompt), or
    a `ValueError` / `TypeError` naming the mismatch: rows are cut by the mask, so a mask of another shape would drop
    or misread tokens silently. No mask: stock's (`_prepare_attention_mask_for_generation`): where `pad_token_id`
    occurs in `input_ids` and is no EOS id, its positions are padding; else every token counts."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.is_complex():
        kind = input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise TypeError(f"input_ids must be an integer tensor of token ids, got {kind}; e.g. tokenizer(texts, "
                        "return_tensors='pt').input_ids")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
        attention_mask = attention_mask[None] if attention_mask is not None and attention_mask.dim() == 1 else \
            attention_mask
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, sequence_length], got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        pads = input_ids.eq(pad_token_id) if pad_token_id is not None and pad_token_id not in eos_token_ids else None
        if pads is not None and bool(pads.any()):
            return input_ids, (~pads).long()
        return input_ids, torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise ValueError(f"attention_mask has shape {shape} but input_ids {tuple(input_ids.shape)}: give one "
                         "entry per token (1: a token, 0: padding), e.g. the tokenizer's own attention_mask")
    return input_ids, attention_mask


def masked_after_start(attention_mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """Rows whose mask has a 0 after the row's first 1: (right-padded rows, whose last slot is such a 0; rows with a
    hole, a 0 between two 1s). A row can be both ([1, 0, 1, 0, 0]): it is right-padded, as stock reads its next
    token's logits at a pad (a hole alone it reads as the engine does). Left padding is neither."""
    mask = attention_mask.bool().cpu()
    started = mask.long().cummax(dim=1).values.bool()
    ended = torch.flip(torch.flip(mask.long(), [1]).cummax(dim=1).values.bool(), [1])  # a 1 at or after each slot
    holes = (started & ended & ~mask).any(dim=1)
    right = started[:, -1] & ~mask[:, -1]
    return right.nonzero().flatten().tolist(), holes.nonzero().flatten().tolist()


def check_prompts(engine, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Raise before any work starts (stock generate users expect exceptions, not FAILED outputs)."""
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise InvalidPromptError(f"row {i} of input_ids is all padding (attention_mask is 0 everywhere)")
        error = engine.validate_prompt(prompt, SamplingParams(max_new_tokens=max_new_tokens))
        if error is not None:
            raise type(error)(f"row {i}: {error}")


def token_ids_of(engine, inputs) -> list[list[int]]:
    """`generate_batch`'s inputs as token-id lists. Raises `InvalidPromptError` before any work for an input that
    is not token ids of this model (not ints, empty, negative, outside the vocabulary): a caller's bug. A prompt
    that is valid but too long ends its own request FAILED instead, and the others run."""
    prompts, params = [], SamplingParams()
    for i, prompt in enumerate(inputs):
        if isinstance(prompt, str | bytes) or not isinstance(prompt, Iterable):
            raise InvalidPromptError(
                f"input {i} of generate_batch is not a list of token ids ({type(prompt).__name__}); encode text "
                "first, e.g. tokenizer(text).input_ids"
            )
        ids = []
        for t in prompt:
            try:
                if isinstance(t, bool):  # an int to Python, never a token id
                    raise TypeError
                ids.append(operator.index(t))
            except TypeError:
                raise InvalidPromptError(
                    f"input {i} of generate_batch is not a list of token ids ({type(prompt).__name__}): it holds "
                    f"{t!r} ({type(t).__name__}), not a token id; give ints, e.g. tokenizer(text).input_ids"
                ) from None
        error = engine.validate_prompt(ids, params)
        if isinstance(error, InvalidPromptError):
            raise InvalidPromptError(f"input {i} of generate_batch: {error}")
        prompts.append(ids)
    return prompts


def check_priorities(priorities, num_inputs: int) -> None:
    if isinstance(priorities, str | bytes) or not isinstance(priorities, Sequence) or len(priorities) != num_inputs:
        count = len(priorities) if isinstance(priorities, Sequence) else type(priorities).__name__
        raise ValueError(f"priorities must be a list of one int per input ({num_inputs}), got {count}")
    bad = [p for p in priorities if isinstance(p, bool) or not isinstance(p, int)]
    if bad:
        raise TypeError(f"priorities must be ints (higher runs first), got {bad[0]!r}")


def per_input_params(sampling_params, num_inputs: int) -> list[SamplingParams]:
    """`sampling_params=` of `generate_batch` (one for all, or one per input) as one per input."""
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_inputs
    if isinstance(sampling_params, str | bytes | dict) or not isinstance(sampling_params, Sequence) or not all(
            isinstance(p, SamplingParams) for p in sampling_params):
        raise TypeError("sampling_params must be a SamplingParams or a list of them (one per input), got "
                        f"{type(sampling_params).__name__}")
    if len(sampling_params) != num_inputs:
        raise ValueError(f"got {len(sampling_params)} sampling_params for {num_inputs} inputs; give one each")
    return list(sampling_params)
