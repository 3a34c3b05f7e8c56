"""Build the logits processors stock `generate` would use, once per prompt length where that matters.

Stock `generate` builds one `LogitsProcessorList` from the generation config (repetition penalty, bad words,
suppressions, warpers...) plus the user's `logits_processor`. The engine calls the same objects per request with
that request's own history (`generate`: the padded row, as stock's processors see it). Processors that depend on
the prompt length (`min_new_tokens`'s EOS suppression among them, which must sit where stock puts it: before the
warpers, and `min_length`, which stock replaces by the prompt's length + `min_new_tokens` whenever `min_new_tokens` is
set) and `forced_eos_token_id` (on the length to generate) get a list per distinct length.
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from hf_paged.compat import prepare_special_tokens, stock_logits_processors


class ProcessorFactory:
    def __init__(self, model, generation_config: GenerationConfig, user_processors, device) -> None:
        self.model = model
        config = copy.deepcopy(generation_config)
        prepare_special_tokens(model, config, device)
        self.config = config
        self.user = LogitsProcessorList(user_processors or [])
        self.device = device
        self.forced_eos = config.forced_eos_token_id is not None  # forced at the last new token (max_length - 1)
        # stock's `_prepare_generated_length`: a min_new_tokens that is set (0 included) overrides min_length with
        # the prompt's length + min_new_tokens ("min_new_tokens will take precedence")
        self.min_new = config.min_new_tokens is not None
        self.length_dependent = (
            config.begin_suppress_tokens is not None or config.exponential_decay_length_penalty is not None
            or self.forced_eos or self.min_new
        )
        self.repetition = config.repetition_penalty not in (None, 1.0)  # skips a row's left padding, as stock's
        self._lists: dict[int | None, list] = {}
        self.vocab_size = int(model.config.get_text_config(decoder=True).vocab_size)

    def for_prompt_length(self, length: int, max_new_tokens: int, left_pads: int = 0) -> list:
        """Stock's list for a prompt (or padded batch) of `length` tokens and `max_new_tokens` to generate, for a row
        of `left_pads` padding tokens first (stock's repetition penalty skips them: `prompt_ignore_length`)."""
        key = (length if self.length_dependent else None, max_new_tokens if self.forced_eos else None,
               left_pads if self.repetition else None)
        procs = self._lists.get(key)
        if procs is None:
            device = self.device if self.device is not None else torch.device("cpu")
            config = self.config
            if self.forced_eos or self.min_new:
                config = copy.deepcopy(config)
            if self.forced_eos:  # stock's max_length for this call (its default otherwise: EOS forced never, or
                config.max_length = length + max_new_tokens  # at a length unrelated to the request)
            if self.min_new:
                config.min_length = length + config.min_new_tokens
            procs = stock_logits_processors(self.model, config, length, self.user, device)
            procs = [RepetitionPenaltyLogitsProcessor(p.penalty, prompt_ignore_length=left_pads)
                     if self.repetition and left_pads and type(p) is RepetitionPenaltyLogitsProcessor else p
                     for p in procs]  # (the config's: a caller's own of that class would clash in stock)
            self._lists[key] = procs
        return procs
