"""Token healing for a free-text `gen` after literal text (guidance's technique).

Text appended by the program is tokenized on its own, so a field that starts mid-token is pushed off the model's
own tokenization: after "Intent: " (its last token a lone space) a model that writes " billing" as one token must
now write "billing" without its space. Healing backs up the prompt's last token and lets the first generated token
be any token whose text starts with the removed token's text:

    prompt:  [... "Intent", ":", " "]      ->  [... "Intent", ":"]      first token: one starting with " "
    output:  [" billing", ...]             ->  the field's value is the text after the removed " "

Only for unconstrained fields (a constraint already decides the field's first bytes) and only when the removed
token has other tokens that extend it; otherwise the prompt is left as it is. Special tokens never extend it: their
text ("<eos>", "<|end|>") is a marker, not text that continues "<".
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.batching.stopping import special_ids
from hf_paged.programs.backend import continuation_texts

__all__ = ["HealingProcessor", "TokenHealing", "heal_prompt", "token_texts"]

_TEXTS: dict[int, tuple[object, list[str]]] = {}  # id(tokenizer) -> (the tokenizer, each token's text)
_TEXTS_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_TEXTS_LOCK")  # a forked child gets a free lock (after_fork.py)
_MAX_TOKENIZERS = 4


def token_texts(tokenizer) -> list[str]:
    """Each token id's text as a continuation of earlier text (memoised for a few tokenizers)."""
    with _TEXTS_LOCK:
        held = _TEXTS.get(id(tokenizer))
        if held is not None and held[0] is tokenizer:
            return held[1]
    texts = continuation_texts(tokenizer, [[i] for i in range(len(tokenizer))])
    with _TEXTS_LOCK:
        if len(_TEXTS) >= _MAX_TOKENIZERS:
            _TEXTS.pop(next(iter(_TEXTS)))
        _TEXTS[id(tokenizer)] = (tokenizer, texts)
    return texts


class HealingProcessor:
    """At a request's first generated position (its history is `prompt_len` tokens), only the `allowed` tokens."""

    def __init__(self, prompt_len: int, allowed: torch.Tensor) -> None:
        self.prompt_len = prompt_len
        self.allowed = allowed  # bool [tokenizer size]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] != self.prompt_len:
            return scores
        mask = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
        n = min(len(self.allowed), len(mask))
        mask[:n] = self.allowed[:n].to(scores.device)
        scores[..., ~mask] = float("-inf")
        return scores


@dataclass(frozen=True, slots=True)
class TokenHealing:
    """The prompt without its last token, that token's text (`lead`: the output starts with it), the processor."""

    prompt: list[int]
    lead: str
    processor: HealingProcessor


def heal_prompt(backend, prompt: list[int]) -> TokenHealing | None:
    """Back up the last token of `prompt` when other tokens extend its text; None when healing changes nothing."""
    if len(prompt) < 2 or prompt[-1] in backend.eos_ids:
        return None
    lead = backend.decode(prompt[-1:])
    if not lead or "\ufffd" in lead:  # part of a character: no token text starts with it
        return None
    special = special_ids(backend.tokenizer) | backend.eos_ids
    allowed = torch.tensor([text.startswith(lead) and i not in special
                            for i, text in enumerate(token_texts(backend.tokenizer))], dtype=torch.bool)
    if int(allowed.sum()) <= 1:  # only the token itself: the model's choice is the same
        return None
    return TokenHealing(prompt[:-1], lead, HealingProcessor(len(prompt) - 1, allowed))
