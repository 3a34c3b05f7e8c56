"""`check_prompt`: why a prompt cannot run on an engine, as the error to raise, or None. The one place the rules live:
`Engine.validate_prompt`, `generate`, `generate_batch`, scoring and the server all ask it (through the engine)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import HfPagedError, InvalidConfigError, InvalidPromptError, PromptTooLongError

__all__ = ["PromptLimits", "check_prompt"]


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """What an engine can take: its model's vocabulary and positions, its pool."""

    vocab_size: int
    max_model_len: int
    block_size: int
    num_blocks: int
    max_prefill_tokens: int | None = None  # without chunked prefill: a prompt is computed in one step of at most this


def check_prompt(prompt_ids: Sequence[int], params: SamplingParams, limits: PromptLimits, *,
                 whole_sequence: bool = False, output_name: str = "max_new_tokens",
                 pool_fix: str = "raise PagedConfig.num_blocks (or max_cache_bytes)") -> HfPagedError | None:
    """`InvalidPromptError` (empty, ids outside the vocabulary, score targets that do not fit), `InvalidConfigError`
    (a logit_bias id outside the vocabulary), `PromptTooLongError` (no room to generate, or more blocks than the pool
    has), or None. `whole_sequence`: the pool must also hold `max_new_tokens` more tokens (a server refuses up front
    what could never finish); by default only the prompt and the first generated token must fit, and a request that
    outgrows the pool later ends with `OutOfBlocksError`.
    `output_name` and `pool_fix` word the pool's message in the caller's terms (the server: `max_tokens`, its
    `--num-blocks` flag)."""
    if len(prompt_ids) == 0:
        return InvalidPromptError("empty prompt: give at least one token id")
    bad = [t for t in prompt_ids if not 0 <= t < limits.vocab_size]
    if bad:
        return InvalidPromptError(f"token ids {bad[:5]} are outside the vocabulary [0, {limits.vocab_size})")
    bad = [t for t in params.logit_bias or () if t >= limits.vocab_size]
    if bad:
        return InvalidConfigError(f"SamplingParams.logit_bias names token ids {bad[:5]} outside the vocabulary "
                                  f"[0, {limits.vocab_size}): bias this model's own token ids")
    targets = params.score_targets
    if targets is not None:
        if len(targets) > len(prompt_ids) or list(prompt_ids[len(prompt_ids) - len(targets) + 1:]) != targets[:-1]:
            return InvalidPromptError(
                f"{len(targets)} score_targets do not fit a prompt of {len(prompt_ids)} tokens: the prompt must "
                "end with all targets but the last (hf_paged.api.scoring builds such requests)"
            )
        if not 0 <= targets[-1] < limits.vocab_size:  # the others are prompt ids, checked above
            return InvalidPromptError(f"score target {targets[-1]} is outside the vocabulary [0, {limits.vocab_size})")
        if len(prompt_ids) > limits.max_model_len:
            return PromptTooLongError(
                f"scored sequence of {len(prompt_ids) + 1} tokens (context + continuation) exceeds the model's "
                f"maximum of {limits.max_model_len} positions by more than one: cut the context from the left"
            )
    elif len(prompt_ids) > limits.max_model_len:  # (a prompt of all the positions still gets its first token, from
        return PromptTooLongError(                # the last position, as in stock generate; rows stop there)
            f"prompt of {len(prompt_ids)} tokens is longer than the model's maximum of {limits.max_model_len} "
            "positions: shorten it"
        )
    if limits.max_prefill_tokens is not None and len(prompt_ids) > limits.max_prefill_tokens:
        return PromptTooLongError(
            f"prompt of {len(prompt_ids)} tokens is longer than one step's budget (max_num_batched_tokens="
            f"{limits.max_prefill_tokens}) and chunked prefill is off: raise PagedConfig.max_num_batched_tokens or "
            "set enable_chunked_prefill=True"
        )
    num_tokens = len(prompt_ids) + (0 if targets is not None else params.max_new_tokens if whole_sequence else 1)
    need = -(-num_tokens // limits.block_size)
    if need > limits.num_blocks:
        grows = whole_sequence and targets is None
        what = f"prompt of {len(prompt_ids)} tokens" + (f" plus {output_name}={params.max_new_tokens}" if grows else
                                                          "" if targets is not None else " and its first new token")
        return PromptTooLongError(
            f"{what} needs {need} blocks but the pool has {limits.num_blocks} (of {limits.block_size} tokens): "
            + (f"lower {output_name}, or {pool_fix}" if grows else pool_fix)
        )
    return None
