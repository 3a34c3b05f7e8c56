"""`Speculator`: the engine's side of speculative decoding (propose, split the logits, verify, settle).

    step:  propose drafts -> schedule (last token + drafts as one chunk) -> forward -> split rows -> verify -> settle
    settle (block_size 4; computed 6, last token t6, drafts d7 d8 d9, d7 kept, d8 rejected):
        before  | t0..t3 | t4 t5 t6 d7 | d8 d9 _ _ |   computed 10
        after   | t0..t3 | t4 t5 t6 d7 |              computed 8 (t6 and d7 hold K/V), new token at position 8
The rejected drafts' K/V needs no clearing: the next step writes over its slots, and attention reads no further
than the context length. Prefix-cache entries stay right by construction: the engine caches full blocks of
verified tokens only (drafts are never in a request's tokens), so a block dropped here was never cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hf_paged.batching.request import Failure, Request
from hf_paged.batching.sampler import Sampler
from hf_paged.batching.sampling import SamplingParams
from hf_paged.batching.speculative.draft import Proposer
from hf_paged.batching.speculative.draft_model import DraftModelProposer
from hf_paged.batching.speculative.prompt_lookup import PromptLookupProposer
from hf_paged.batching.speculative.verification import DraftRows, Verdict, verify
from hf_paged.batching.step_inputs import StepInputs
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.config import PagedConfig
from hf_paged.errors import HfPagedError, UnsupportedGenerationError

# draft models whose proposers (their own paged KV pool each) an engine keeps: a caller passing a new draft model
# object per request (or per job in a long-lived process) must not keep every one alive
MAX_DRAFT_MODELS = 4


def speculation_unsupported(config: PagedConfig, compressed: bool) -> str | None:
    """Why rejected drafts could not be rolled back in an engine of this config (None: they can)."""
    if compressed:
        return ("needs uncompressed KV blocks (a block quantized when drafts filled it cannot take other tokens "
                "back): use kv_cache_dtype='auto' and no streaming heads")
    if config.kv_pruning is not None:
        return f"does not work with kv_pruning={config.kv_pruning!r}: use kv_pruning=None"
    return None


@dataclass(slots=True)
class DraftFailure:
    """A request whose drafter could not run: it fails with `error`."""

    request: Request
    error: Failure


@dataclass(slots=True)
class SplitRows:
    """A step's logits, split by whether the request drafted."""

    requests: list[Request]  # the sampled requests without drafts
    logits: torch.Tensor  # their rows, one each, in that order
    drafted: DraftRows  # the rows of the requests with drafts (1 + k each)


class Speculator:
    """Drafts for the running requests that ask for them (`SamplingParams.num_speculative_tokens`), and the
    bookkeeping of their verification.

    Args:
        kv: the engine's block tables (rejected drafts' slots are given back there).
        config: the engine's settings (block size and pool size of draft models' caches).
        num_blocks: blocks of the engine's pool (a draft model's cache gets as many).
        vocab_size, max_model_len: the model's.
        unsupported: why this engine cannot speculate (a storage that cannot roll back), or None.
    """

    def __init__(self, kv: KVCacheManager, config: PagedConfig, *, num_blocks: int, vocab_size: int,
                 max_model_len: int, unsupported: str | None = None) -> None:
        self.kv = kv
        self.config = config
        self.num_blocks = num_blocks
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.unsupported = unsupported
        # tensor parallel (set by the api): each rank drafts and accepts with its own generator, which the sampler's
        # rank sync does not reach; only a seeded request draws alike everywhere
        self.needs_seed = False
        self.prompt_lookup = PromptLookupProposer()
        # id(draft model) -> its proposer (which holds the model: the id is not recycled while listed), least
        # recently used first; past MAX_DRAFT_MODELS an idle proposer goes with its model reference and KV pool
        self.draft_models: OrderedDict[int, DraftModelProposer] = OrderedDict()

    def check(self, params: SamplingParams) -> HfPagedError | None:
        """Why a request with these params cannot run, as the error to fail it with, or None. Builds a draft
        model's proposer (and cache) at its first use."""
        if not params.num_speculative_tokens:
            return None
        if self.unsupported is not None:
            return UnsupportedGenerationError(
                f"speculative decoding (num_speculative_tokens={params.num_speculative_tokens}) {self.unsupported}")
        if self.needs_seed and params.do_sample and params.seed is None:
            return UnsupportedGenerationError(
                "sampled speculative decoding under tensor parallelism needs a seed (SamplingParams(seed=...), the "
                "same on every rank): each rank draws its drafts and its accept/reject verdicts itself, and unseeded "
                "ranks would fall out of step")
        if params.draft_model is not None:
            try:
                self._proposer_of(params)
            except HfPagedError as exc:
                return exc
        return None

    def _proposer_of(self, params: SamplingParams) -> Proposer:
        model = params.draft_model
        if model is None:
            return self.prompt_lookup
        proposer = self.draft_models.get(id(model))
        if proposer is None:
            proposer = self.draft_models[id(model)] = DraftModelProposer(
                model, vocab_size=self.vocab_size, block_size=self.config.block_size, num_blocks=self.num_blocks,
                attention_backend=self.config.attention_backend)
            idle = [key for key, other in self.draft_models.items() if not other.kv.seqs and other is not proposer]
            for key in idle[: max(0, len(self.draft_models) - MAX_DRAFT_MODELS)]:
                del self.draft_models[key]
        self.draft_models.move_to_end(id(model))
        return proposer

    def propose(self, running: Sequence[Request]) -> list[DraftFailure]:
        """Set `draft_ids` (and `draft_probs`) of every running decode that speculates; returns the requests whose
        drafter failed, with the error (they should fail: their draft model cannot run)."""
        groups: dict[int, tuple[Proposer, list[Request], list[int]]] = {}
        for request in running:
            params = request.params
            if not params.num_speculative_tokens:
                continue
            request.draft_ids, request.draft_probs = [], None
            if request.num_tokens_to_compute != 1 or not request.output_ids:
                continue  # a prompt chunk or forced tokens to compute first; or a prompt's last token (a 1-token
                # chunk looks like a decode), whose first token comes the plain way, where its `n` forks are made
            # the step emits up to k + 1 tokens: stay within max_new_tokens and the model's positions
            k = min(params.num_speculative_tokens, params.max_new_tokens - len(request.output_ids) - 1,
                    self.max_model_len - request.num_tokens - 1)
            if k < 1:
                continue
            proposer = self._proposer_of(params)
            group = groups.setdefault(id(proposer), (proposer, [], []))
            group[1].append(request)
            group[2].append(k)
        failed: list[DraftFailure] = []
        for proposer, requests, num_tokens in groups.values():
            try:
                drafts = proposer.propose(requests, num_tokens)
            except Exception as exc:  # noqa: BLE001 -- a draft model that cannot run fails its requests only
                failure = Failure.of(exc, "draft model failed")
                failed.extend(DraftFailure(r, failure) for r in requests)
                continue
            for request, draft in zip(requests, drafts):
                request.draft_ids, request.draft_probs = draft.token_ids, draft.probs
        return failed

    @staticmethod
    def split(inputs: StepInputs, logits: torch.Tensor) -> SplitRows:
        """The sampled requests without drafts and their logits (one row each), and the rows of those with."""
        plain: list[Request] = []
        plain_rows: list[int] = []
        rows = DraftRows([], logits, [], [])
        draft_rows: list[int] = []
        row = 0
        for request, k in zip(inputs.sampled_requests, inputs.num_draft_tokens):
            if k:
                rows.requests.append(request)
                rows.first_rows.append(len(draft_rows))
                rows.num_drafts.append(k)
                draft_rows.extend(range(row, row + k + 1))
            else:
                plain.append(request)
                plain_rows.append(row)
            row += 1 + k
        if plain:
            rows.logits = logits.index_select(0, torch.tensor(draft_rows, device=logits.device))
            logits = logits.index_select(0, torch.tensor(plain_rows, device=logits.device))
        return SplitRows(plain, logits, rows)

    @staticmethod
    def verify(rows: DraftRows, sampler: Sampler) -> list[Verdict]:
        return verify(rows, sampler)

    def settle(self, request: Request, verdict: Verdict) -> None:
        """Count the verdict and roll back the rejected drafts: the request's computed tokens end after its last
        kept draft and its block table with them (whole blocks past that go back to the pool)."""
        request.num_draft_tokens += verdict.num_drafted
        request.num_accepted_tokens += verdict.num_accepted
        rejected = verdict.num_drafted - verdict.num_accepted
        if rejected:
            request.num_computed_tokens -= rejected
            self.kv.truncate(request.request_id, request.num_computed_tokens)
        request.draft_ids, request.draft_probs = [], None

    def release(self, request_id: str) -> None:
        """Forget an ended request in every drafter."""
        self.prompt_lookup.release(request_id)
        for proposer in self.draft_models.values():
            proposer.release(request_id)

    def check_integrity(self, live_ids: set[str]) -> None:
        self.prompt_lookup.check_integrity(live_ids)
        for proposer in self.draft_models.values():
            proposer.check_integrity(live_ids)
