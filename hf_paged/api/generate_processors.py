"""Build the logits processors stock `generate` would use, once per prompt length where that matters.

Stock `generate` builds one `LogitsProcessorList` from the generation config (repetition penalty, bad words,
suppressions, warpers...) plus the user's `logits_processor`. The engine calls the same objects per request with
that request's own history. `min_new_tokens` is left to the sampler (it counts each request's own prompt);
processors that depend on the prompt length get a list per distinct length.
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, LogitsProcessorList

from hf_paged.compat import prepare_special_tokens, stock_logits_processors


class ProcessorFactory:
    def __init__(self, model, generation_config: GenerationConfig, user_processors, device) -> None:
        self.model = model
        config = copy.deepcopy(generation_config)
        config.min_new_tokens = None  # the sampler enforces it per request
        prepare_special_tokens(model, config, device)
        self.config = config
        self.user = LogitsProcessorList(user_processors or [])
        self.device = device
        self.length_dependent = (
            config.begin_suppress_tokens is not None or config.exponential_decay_length_penalty is not None
        )
        self._lists: dict[int | None, list] = {}
        self.vocab_size = int(model.config.get_text_config(decoder=True).vocab_size)

    def for_prompt_length(self, length: int) -> list:
        key = length if self.length_dependent else None
        procs = self._lists.get(key)
        if procs is None:
            device = self.device if self.device is not None else torch.device("cpu")
            procs = stock_logits_processors(self.model, self.config, length, self.user, device)
            procs = list(procs)
            self._lists[key] = procs
        return procs
