"""What the multi-process tests run, shared by the workers (under torchrun) and the single-process references."""

from __future__ import annotations

import hf_paged
from tests.tiny_models import ragged_prompts

BLOCK_SIZE = 4
MAX_NEW_TOKENS = 8
TP_FAMILIES = ("llama", "qwen2")


def dp_prompts() -> list[list[int]]:
    """Two shared system prompts (prefix groups) and one-off prompts of mixed lengths."""
    system_a, system_b = ragged_prompts([24, 12], seed=11)
    tails = ragged_prompts([3, 5, 7, 2, 9, 4], seed=12)
    return ([system_a + t for t in tails[:4]] + [system_b + t for t in tails[4:]]
            + ragged_prompts([30, 3, 17, 11, 6], seed=14))


def dp_sampling_params() -> list[hf_paged.SamplingParams]:
    """Seeded sampling, one setting per input, some with two sequences (forks come back after their parent)."""
    return [hf_paged.SamplingParams(max_new_tokens=6, do_sample=True, temperature=0.8, seed=100 + 10 * i,
                                    num_return_sequences=2 if i % 3 == 0 else 1)
            for i in range(len(dp_prompts()))]


def tp_prompts() -> list[list[int]]:
    system = ragged_prompts([20], seed=21)[0]
    return [system + t for t in ragged_prompts([2, 6, 3], seed=22)] + ragged_prompts([5, 40, 17, 9, 26], seed=23)


def tp_sampling_params() -> list[hf_paged.SamplingParams]:
    return [hf_paged.SamplingParams(max_new_tokens=6, do_sample=True, top_k=20, seed=7 + 10 * i)
            for i in range(len(tp_prompts()))]


def callback_prompts() -> list[list[int]]:
    system_a, system_b = ragged_prompts([40, 36], seed=11)
    return [system_a + q for q in ragged_prompts([3, 5, 7], seed=12)] + \
        [system_b + q for q in ragged_prompts([4, 6], seed=13)]


def tokens(outputs: dict) -> dict[str, list[int]]:
    return {name: list(o.generated_tokens) for name, o in outputs.items()}


def output_fields(outputs: dict) -> dict:
    """What must survive the gather besides the tokens: finish reasons, logprobs (chosen and top), scores."""
    return {name: {"finish_reason": o.finish_reason, "num_scores": len(o.scores),
                   "logprobs": [[e.token_id, round(e.logprob, 5)] for e in o.logprobs],
                   "top": [[t.token_id for t in e.top] for e in o.logprobs],
                   "score_argmax": [int(s.argmax()) for s in o.scores]} for name, o in outputs.items()}
