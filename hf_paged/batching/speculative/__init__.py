"""Speculative decoding in the engine: draft a few tokens per request, verify them in one forward, keep a prefix.

    propose (before scheduling)   verify (after the forward)          settle
    prompt lookup | draft model -> the model's choice at each draft -> computed tokens and block table cut back
                                   (greedy: argmax; sampled:           past the last kept draft
                                   rejection sampling)

The face of the stage is `Speculator` (what the engine calls); the drafters implement `Proposer`.
"""

from hf_paged.batching.speculative.draft import Draft, Proposer
from hf_paged.batching.speculative.draft_model import DraftModelProposer
from hf_paged.batching.speculative.prompt_lookup import NgramIndex, PromptLookupProposer
from hf_paged.batching.speculative.speculator import DraftFailure, Speculator, SplitRows, speculation_unsupported
from hf_paged.batching.speculative.verification import DraftRows, Verdict, verify

__all__ = ["Draft", "DraftFailure", "DraftModelProposer", "DraftRows", "NgramIndex", "PromptLookupProposer",
           "Proposer", "Speculator", "SplitRows", "Verdict", "speculation_unsupported", "verify"]
