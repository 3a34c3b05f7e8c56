"""Shared logic of the guided processors: one compiled index, one guide state per row (stock `generate`) or per
request (the continuous-batching engine), one preallocated bitmask.

    constraint --(subclass)--> regex | Grammar --IndexCache--> CompiledIndex (shared; masks memoised per automaton state)
                                                        |
              generate: row i  ----> GuideState(int)    |  engine: request id ----> GuideState(int)
                                           \\            |            /
                          state's memoised words -> bitmask [rows, words] -> applied in place
                                                   (CPU: one compiled loop per row; CUDA: Triton)

A guide state is a plain automaton state id: advancing walks the token's bytes through the byte automaton.
EOS: every EOS/stop id is allowed exactly in final states. A row whose document emitted EOS, or that was fed a
token the automaton refuses (e.g. forced by another processor), may only produce EOS from then on. So may a row
that reaches a dead end of the vocabulary: a state the text may continue from, but with no token that spells a
continuation (a vocabulary without byte fallback that lacks a character, e.g. a Unigram one without `\\`); its
`error` says so, and the document ends unfinished rather than with a row of -inf logits (NaN when sampled).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from hf_paged.errors import SchemaTooComplexError, TokenizerError
from hf_paged.processors.automaton import Grammar, check_automaton, validate_regex
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index import (
    CompiledIndex,
    IndexCache,
    StateMask,
    TokenVocabulary,
    allocate_token_bitmask,
    apply_token_bitmask_,
    build_vocabulary,
    default_index_cache,
    index_key,
    num_bitmask_words,
)

__all__ = ["GuideState", "GuidedLogitsProcessor"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class GuideState:
    """Where one sequence stands in the automaton."""

    state: int  # automaton state of the shared index
    num_consumed: int = 0  # generated tokens already advanced over
    finished: bool = False  # EOS was produced: only EOS from now on
    error: str | None = None  # a refused token ended the document early: only EOS from now on


def _eos_only_mask(eos_ids: tuple[int, ...], vocab_size: int) -> StateMask:
    ids = np.asarray(sorted(eos_ids), dtype=np.int64)
    words = np.zeros(num_bitmask_words(vocab_size), dtype=np.uint32)
    np.bitwise_or.at(words, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
    return StateMask(words.view(np.int32), len(ids), -1)


class GuidedLogitsProcessor(LogitsProcessor):
    """Masks logits so that the generated text matches a regex (or a `Grammar`); subclasses turn their constraint
    into one.

    Works in stock `model.generate` (`__call__`, every row its own state, reusable across calls) and in the
    continuous-batching engine (`process_rows`, state keyed by request id). See the subclasses for examples.
    """

    supports_continuous_batching = True

    def __init__(
        self,
        regex: str | Grammar,
        tokenizer: Any,
        *,
        key_parts: tuple[Any, ...],
        eos_token_id: int | Iterable[int] | None = None,
        index_cache: IndexCache | None = None,
        backend: str = "auto",
        budget: CompileBudget | None = None,
        translated: bool = False,
    ) -> None:
        self.vocab: TokenVocabulary = build_vocabulary(tokenizer, eos_token_id)
        self.regex = regex
        self.backend = backend
        self.index_cache = index_cache if index_cache is not None else default_index_cache()
        self.index_key = index_key(*key_parts, self.vocab.fingerprint)
        self.budget = budget if budget is not None else CompileBudget()
        if self.index_cache.get(self.index_key) is None:
            # the byte automaton, its work counted: bad patterns, empty languages and automata over the budget raise
            # here, at construction (the token index is built later, in the background, from the memoised automaton)
            if translated:  # the translator built these automata under the same limits: the size estimate, a
                check_automaton(regex, self.budget)  # guard before a build, has nothing left to guard (memo hits)
            else:
                validate_regex(regex, max_regex_size=self.index_cache.max_regex_size, budget=self.budget)
        self._future: Future | None = None
        self._compiled: CompiledIndex | None = None
        self._eos_ids = self.vocab.eos_token_ids
        self._eos_set = frozenset(self._eos_ids)
        # stock generate: per-row states, and the ids of the previous call to recognise a new generate() call
        self._rows: list[GuideState] = []
        self._prev_ids: torch.Tensor | None = None
        self._prompt_len = 0  # length of input_ids at the first step of the current generate call
        # engine: per-request states
        self._requests: dict[str, GuideState] = {}
        self._bitmask = allocate_token_bitmask(1, self.vocab.vocab_size)
        self._bitmask_np = self._bitmask.numpy()
        self._copy_done: Any = None  # CUDA event of the last bitmask upload
        self._eos_only = _eos_only_mask(self._eos_ids, self.vocab.vocab_size)  # rows whose document has ended

    # -- compilation -----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Start compiling the index in a background thread (idempotent, returns at once)."""
        if self._compiled is None and self._future is None:
            self._future = self.index_cache.compile_async(self.index_key, self.regex, self.vocab, self.budget)

    @property
    def compiled(self) -> CompiledIndex:
        """The compiled index, waiting for the build (bounded by its work budget; at most
        `index_cache.max_compile_s` seconds when that opt-in limit is set)."""
        if self._compiled is None:
            self.prepare()
            assert self._future is not None
            try:
                self._compiled = self._future.result(timeout=self.index_cache.max_compile_s)
            except FutureTimeout:
                raise SchemaTooComplexError(
                    f"building the token index took longer than {self.index_cache.max_compile_s:g} s; simplify "
                    "the constraint or raise `IndexCache(max_compile_s=...)`"
                ) from None
        return self._compiled

    @property
    def num_index_bytes(self) -> int:
        """Bytes of the compiled index this processor holds (`CompiledIndex.num_bytes`; 0 before it is compiled):
        a processor keeps its index alive after `index_cache` drops it, so caches of processors weigh them by it."""
        compiled = self._compiled
        return 0 if compiled is None else compiled.num_bytes

    # -- per-sequence state ----------------------------------------------------------------------------
    def _new_state(self) -> GuideState:
        return GuideState(self.compiled.index.get_initial_state())

    def _advance(self, state: GuideState, token_id: int) -> None:
        state.num_consumed += 1
        if state.finished or state.error is not None:
            return
        if token_id in self._eos_set:
            state.finished = True
            return
        following = (self._compiled or self.compiled).index.get_next_state(state.state, token_id)
        if following is None:
            state.error = f"token {token_id} is not allowed in automaton state {state.state}"
            logger.warning("guided decoding: %s; the document is ended (only EOS allowed from now on)", state.error)
        else:
            state.state = following

    def _catch_up(self, state: GuideState, generated: Sequence[int]) -> None:
        if len(generated) == state.num_consumed:
            return
        for token_id in generated[state.num_consumed :]:
            self._advance(state, int(token_id))

    def _ensure_rows(self, num_rows: int) -> torch.Tensor:
        if self._bitmask.shape[0] < num_rows:
            self._bitmask = allocate_token_bitmask(max(num_rows, 2 * self._bitmask.shape[0]), self.vocab.vocab_size)
            self._bitmask_np = self._bitmask.numpy()
        return self._bitmask[:num_rows]

    def _row_mask(self, state: GuideState, compiled: CompiledIndex) -> StateMask:
        if state.finished or state.error is not None:
            return self._eos_only
        mask = compiled.mask(state.state)
        if mask.num_allowed == 0:
            self._dead_end(state)
            return self._eos_only
        return mask

    def _dead_end(self, state: GuideState) -> None:
        state.error = (
            f"no token of the vocabulary continues the text in automaton state {state.state} (the tokenizer cannot "
            "spell any character the constraint allows next: a vocabulary without byte fallback)"
        )
        logger.warning("guided decoding: %s; the document is ended (only EOS allowed from now on)", state.error)

    def _check_width(self, scores: torch.Tensor) -> None:
        width, needed = scores.shape[-1], self.vocab.min_logits_width
        if width < needed:
            raise TokenizerError(
                f"the logits have {width} columns but the tokenizer's vocabulary has ids up to {needed - 1} that the "
                f"constraint may allow: the model cannot produce them. Build the processor with the model's own "
                "tokenizer, or after adding tokens call model.resize_token_embeddings(len(tokenizer))"
            )

    def _mask(self, states: Sequence[GuideState], scores: torch.Tensor) -> torch.Tensor:
        if self._copy_done is not None:  # the last asynchronous upload still reads the buffer we rewrite
            self._copy_done.synchronize()
            self._copy_done = None
        self._check_width(scores)
        bitmask = self._ensure_rows(len(states))
        compiled = self.compiled
        masks = [self._row_mask(state, compiled) for state in states]
        for row, mask in enumerate(masks):
            self._bitmask_np[row] = mask.words  # a copy of the memoised words (6 KB with GPT-2's vocabulary)
        if scores.is_cuda:
            bitmask = bitmask.to(scores.device, non_blocking=True)
            self._copy_done = torch.cuda.Event()
            self._copy_done.record()
        return apply_token_bitmask_(scores, bitmask, backend=self.backend)

    # -- contract 1: stock transformers generate -------------------------------------------------------
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Mask `scores` [batch, vocab] in place for each row of `input_ids` [batch, length]; returns `scores`.

        A call continues the previous one when the batch size is the same, the prompt part is unchanged and the ids
        are at most one token longer; otherwise it is a new `generate` call and every row starts a fresh document
        at its first generated token. A row one token past its previous row advances by that token; any other row
        (beam search reorders rows; assisted decoding judges candidates position by position, then goes back to
        the accepted ones) is replayed from the prompt, so its state always matches its own tokens.
        """
        batch, length = input_ids.shape
        prev = self._prev_ids
        continuing = (
            prev is not None
            and prev.shape[0] == batch
            and self._prompt_len <= length <= prev.shape[1] + 1
            and len(self._rows) == batch
            and torch.equal(prev[:, : self._prompt_len], input_ids[:, : self._prompt_len])
        )
        if continuing:
            assert prev is not None
            if prev.shape[1] + 1 == length:
                same_row = (prev == input_ids[:, :-1]).all(dim=1).tolist()
            else:
                same_row = [False] * batch
            last = input_ids[:, -1].tolist()
            for row in range(batch):
                if same_row[row]:
                    self._advance(self._rows[row], last[row])
                else:
                    state = self._new_state()
                    self._catch_up(state, input_ids[row, self._prompt_len :].tolist())
                    self._rows[row] = state
        else:
            self._rows = [self._new_state() for _ in range(batch)]
            self._prompt_len = length
        self._prev_ids = input_ids.clone()
        return self._mask(self._rows, scores)

    def reset(self) -> None:
        """Forget every row and request (the next call starts fresh)."""
        self._rows = []
        self._prev_ids = None
        self._requests.clear()

    # -- contract 2: the continuous-batching engine ----------------------------------------------------
    def _request_state(self, request_id: str, generated: Sequence[int]) -> GuideState:
        state = self._requests.get(request_id)
        if state is None or len(generated) < state.num_consumed:  # unknown, or restarted (e.g. preempted)
            state = self._requests[request_id] = self._new_state()
        self._catch_up(state, generated)
        return state

    def process_rows(
        self, request_ids: Sequence[str], generated: Sequence[Sequence[int]], scores: torch.Tensor
    ) -> torch.Tensor:
        """Mask `scores` [n, vocab] in place: row `i` belongs to `request_ids[i]`, which has produced
        `generated[i]` so far. Unknown ids start a fresh document. Blocks until the index is compiled."""
        if len(request_ids) != scores.shape[0] or len(generated) != scores.shape[0]:
            raise ValueError(
                f"process_rows got {len(request_ids)} request ids and {len(generated)} histories for "
                f"{scores.shape[0]} score rows; pass one of each per row"
            )
        states = [self._request_state(rid, gen) for rid, gen in zip(request_ids, generated)]
        return self._mask(states, scores)

    def forced_tokens(self, request_id: str, generated: Sequence[int], max_tokens: int) -> list[int]:
        """Jump-forward: the chain of tokens that are each the only allowed continuation (never EOS), at most
        `max_tokens`. The request's state is not moved: the engine feeds them back through `generated`."""
        state = self._request_state(request_id, generated)
        if state.finished or state.error is not None:
            return []
        compiled = self.compiled
        index_state = state.state
        forced: list[int] = []
        while len(forced) < max_tokens:
            token_id = compiled.forced_token(index_state)
            if token_id is None:
                break
            forced.append(token_id)
            index_state = compiled.index.get_next_state(index_state, token_id)
        return forced

    def allows(self, request_id: str, generated: Sequence[int], token_id: int) -> bool:
        """True when `token_id` may follow `generated` for this request: the bit of the state's memoised mask when
        it has one, else a walk of the token's bytes; no vocabulary mask is computed (resample mode). EOS ids are
        allowed exactly in final states (and alone once the document ended, or at a dead end of the vocabulary, which
        an EOS asked at a state that is not final reads the state's mask to tell). The state is not moved."""
        state = self._request_state(request_id, generated)
        if state.finished or state.error is not None:
            return token_id in self._eos_set
        compiled = self.compiled
        if token_id in self._eos_set:
            if compiled.index.is_final_state(state.state):
                return True
            if compiled.mask(state.state).num_allowed == 0:  # a dead end of the vocabulary: the document ends
                self._dead_end(state)
                return True
            return False
        if not 0 <= token_id < self.vocab.vocab_size:
            return False
        mask = compiled.state_mask(state.state)
        if mask is not None:
            return bool((int(mask.words[token_id >> 5]) >> (token_id & 31)) & 1)
        return compiled.index.get_next_state(state.state, token_id) is not None

    def is_complete(self, request_id: str, generated: Sequence[int] | None = None) -> bool:
        """True when the request's document is complete (EOS allowed now, or already produced) after `generated`
        (its whole output: the last token is read first; None: as far as the state has read)."""
        if generated is not None and request_id in self._requests:
            self._request_state(request_id, generated)
        state = self._requests.get(request_id)
        if state is None:
            return False
        return state.finished or self.compiled.index.is_final_state(state.state)

    def accepts(self, generated: Sequence[int]) -> bool:
        """True when `generated` (an output from its first token) is a whole document: its automaton ends in a final
        state (EOS would be allowed next) or it ends with EOS, no token refused. No request's state is read or kept:
        this asks about any token list, e.g. an output cut back to a budget."""
        state = self._new_state()
        self._catch_up(state, generated)
        return state.error is None and (state.finished or self.compiled.index.is_final_state(state.state))

    def error(self, request_id: str) -> str | None:
        """Why the request's document was cut short (a refused token), or None."""
        state = self._requests.get(request_id)
        return None if state is None else state.error

    def release(self, request_id: str) -> None:
        """Forget the request's state (finished or aborted); unknown ids are ignored."""
        self._requests.pop(request_id, None)

    @property
    def num_active_requests(self) -> int:
        return len(self._requests)
