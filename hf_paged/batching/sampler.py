"""`Sampler`: logits rows -> next tokens, per request (processors, warpers, seeds), in `generate`'s order.

Order per row, as stock `generate`: min_new_tokens' EOS suppression (stock's built-in processor, which its list puts
before the caller's) -> [OpenAI's logit_bias] -> logits processors (each with this request's own history; `generate`
passes stock's whole list there) -> [presence and frequency penalties, `penalties.py`] -> temperature -> [min-p] ->
top-k -> top-p -> argmax or a draw: a seeded request's from noise keyed by its seed and the token's position
(`seeded_draws.py`: the same tokens whatever the schedule, speculation or constraint mode), an unseeded one's from
torch's global generator. Rows without processors, penalties or sampling take a single batched argmax; sampled rows
without stock processors (but row-only warpers), penalties or a seed go through the chain in runs of consecutive rows
with the same warpers, each run drawing from torch's global generator at once; unseeded rows draw in arrival order
(stock's row order), whatever order the scheduler gave them.

A constrained row in `constraint_mode="resample"` is processed without its mask, picked, and checked against the
constraint; only a refused token costs the mask and a second pick (`constraint_modes.py`).

Rows of requests with `SamplingParams.logprobs` get their raw log-probabilities first (one log_softmax of those rows,
before anything edits the logits; `logprobs.py`), and the chosen token's entry once it is picked.

Under tensor parallelism every rank samples from the same all-reduced logits, but from its own generator: `sync`
(set by the api for a split model) makes every rank take the first rank's picks, so ranks whose generators differ
(an unseeded draw, a rank seeded differently) stay in step instead of feeding their forwards different tokens.

`process` applies the same chain without picking, for a request whose history is extended by `pending` tokens
not yet appended (speculative verification scores each drafted position with the drafts before it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from hf_paged.batching.constraint_modes import ConstraintStats, resample_checks
from hf_paged.batching.constraint_protocol import RequestConstraint
from hf_paged.batching.logprobs import RowLogprobs, TokenLogprobs
from hf_paged.batching.penalties import apply_logit_bias, apply_output_penalties, has_penalties
from hf_paged.batching.request import Failure, Request
from hf_paged.batching.seeded_draws import draw
from hf_paged.batching.stock_batch import NO_GHOSTS, StockBatch, draw_ghosts, ghost_counts
from hf_paged.errors import SamplingError


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int | None]  # None where the row failed
    errors: list[Failure | None]  # why each failed row failed
    logprobs: list[TokenLogprobs | None]  # the chosen token's raw log-probability, for rows that ask (logprobs.py)

    @classmethod
    def plain(cls, tokens: list[int]) -> SampleResult:
        """Tokens picked without the sampler (a plain greedy step's argmax): no failures, no log-probabilities."""
        return cls(tokens, [None] * len(tokens), [None] * len(tokens))


@dataclass(slots=True)
class ProcessedRows:
    rows: list[torch.Tensor | None]  # [1, vocab] scores after processors and warpers; None where the row failed
    errors: list[Failure | None]  # why each failed row failed


class Sampler:
    """Picks one token per row of logits."""

    def __init__(self) -> None:
        self.constraint_stats = ConstraintStats()
        # tensor parallel: the first rank's tokens (None: that rank's row failed) replacing this rank's own
        self.sync: Callable[[list[int | None]], list[int | None]] | None = None
        self.stock_batches: dict[str, StockBatch] = {}  # request id -> its `generate` call's rows (stock_batch.py)

    def __call__(self, requests: Sequence[Request], logits: torch.Tensor) -> SampleResult:
        n = len(requests)
        tokens: list[int | None] = [None] * n
        errors: list[Failure | None] = [None] * n
        asking = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        # before the processors below edit the logits in place: the model's raw distribution
        raw = RowLogprobs.of(logits, asking, [requests[i].params.logprobs for i in asking]) if asking else None
        scores = logits.clone() if any(r.params.output_logits for r in requests) else logits  # modified in place
        plain = [i for i, r in enumerate(requests) if is_plain_greedy(r)]
        if len(plain) == n:  # every row greedy with nothing to apply: one argmax, no row selection
            tokens = scores.argmax(dim=-1).tolist()
        elif plain:
            idx = torch.tensor(plain, device=scores.device)
            for i, tok in zip(plain, scores.index_select(0, idx).argmax(dim=-1).tolist()):
                tokens[i] = tok
        special = [i for i in range(n) if tokens[i] is None]
        resampled = {i for i in special if resample_checks(requests[i])}
        self._apply_batched_processors(requests, scores, [i for i in special if i not in resampled], errors)
        # unseeded draws take torch's global stream in arrival order (stock's row order), not the schedule's: a warm
        # prefix cache admits the longest cached prompts first, which put a second identical call's draws elsewhere
        # (the batched processors above want row order: a contiguous run of rows is masked as one slice)
        special.sort(key=lambda i: (requests[i].arrival_index, requests[i].fork_index))
        # a `generate` call's ended rows still take their draws, as in stock's batch (stock_batch.py)
        ghosts = ghost_counts(self.stock_batches, requests, special) if self.stock_batches else {}
        self._draw_together(requests, logits, scores, [i for i in special if i not in resampled and errors[i] is None
                                                       and _drawn_together(requests[i])], tokens, errors, ghosts)
        for i in special:
            if errors[i] is not None or tokens[i] is not None:
                continue
            request = requests[i]
            if request.params.output_logits:
                request.logits.append(logits[i].clone())
            try:
                if i in resampled:
                    tokens[i] = self._resample(request, scores[i : i + 1])
                    continue
                row = self._process_row(request, scores[i : i + 1])
            except Exception as exc:  # noqa: BLE001 -- a user processor failed: only this request fails
                errors[i] = Failure.of(exc, "logits processor failed")
                continue
            try:  # a row the processors left unusable (None, NaN, a temperature that overflows it): this one fails
                if request.params.output_scores:
                    request.scores.append(row[0].clone())
                before, after = ghosts.get(i, NO_GHOSTS)
                draw_ghosts(before, row)
                tokens[i] = self._pick(request, row)
                draw_ghosts(after, row)
            except Exception as exc:  # noqa: BLE001
                errors[i] = Failure.of(exc, "sampling failed")
        if self.sync is not None and special:  # (a plain greedy step picks the same on every rank)
            _take_synced(self.sync(tokens), tokens, errors)
        logprobs: list[TokenLogprobs | None] = [None] * n
        if raw is not None:
            for i, entry in zip(asking, raw.tokens([tokens[i] for i in asking])):
                logprobs[i] = entry
        return SampleResult(tokens, errors, logprobs)

    def process(self, requests: Sequence[Request], scores: torch.Tensor,
                pending: Sequence[Sequence[int]]) -> ProcessedRows:
        """Row `i` of `scores` through request `i`'s processors and warpers, as if its output went on with
        `pending[i]`; edits `scores` in place. Nothing is recorded on the requests and nothing is picked."""
        n = len(requests)
        errors: list[Failure | None] = [None] * n
        rows: list[torch.Tensor | None] = [None] * n
        self._apply_batched_processors(requests, scores, list(range(n)), errors, pending)
        for i, request in enumerate(requests):
            if errors[i] is not None:
                continue
            try:
                rows[i] = self._process_row(request, scores[i : i + 1], pending[i])
            except Exception as exc:  # noqa: BLE001 -- a user processor failed: only this request fails
                errors[i] = Failure.of(exc, "logits processor failed")
        return ProcessedRows(rows, errors)

    def _apply_batched_processors(self, requests: Sequence[Request], scores: torch.Tensor, rows: list[int],
                                  errors: list[Failure | None],
                                  pending: Sequence[Sequence[int]] | None = None) -> None:
        """The constraints mask all their rows at once (one bitmask per batch)."""
        groups: dict[int, tuple[RequestConstraint, list[int]]] = {}
        for i in rows:
            for proc in requests[i].processors.constraints:
                groups.setdefault(id(proc), (proc, []))[1].append(i)
        self._count_masks(requests, sorted({i for _, members in groups.values() for i in members}), pending is None)
        for proc, members in groups.values():
            ids = [requests[i].request_id for i in members]
            histories = [requests[i].output_ids if pending is None or not pending[i]
                         else requests[i].output_ids + list(pending[i]) for i in members]
            first, last = members[0], members[-1]
            contiguous = last - first + 1 == len(members)  # sorted rows: a plain slice, masked in place, no copies
            try:
                if contiguous:
                    view = scores[first : last + 1]
                    masked = proc.process_rows(ids, histories, view)
                    if masked is not view:
                        view.copy_(masked)
                else:
                    idx = torch.tensor(members, device=scores.device)
                    masked = proc.process_rows(ids, histories, scores.index_select(0, idx))
                    scores.index_copy_(0, idx, masked)
            except Exception as exc:  # noqa: BLE001 -- isolate the failure to this processor's requests
                failure = Failure(f"logits processor {type(proc).__name__} failed: {exc}", type(exc))
                for i in members:
                    errors[i] = failure

    def _draw_together(self, requests: Sequence[Request], logits: torch.Tensor, scores: torch.Tensor,
                       rows: list[int], tokens: list[int | None], errors: list[Failure | None],
                       ghosts: dict[int, tuple[int, int]]) -> None:
        """Sampled rows with no stock processor but row-only warpers and no seed of their own, in runs of
        consecutive rows with the same warpers: the chain of `_process_row` on a run's rows at once (each row's
        values as alone), then one draw from torch's global generator for the run. Runs follow the rows' arrival
        order, so the stream is the one `_pick` row by row takes (and stock's batch). A run is at most `_RUN_BYTES`
        of logits: row by row was ~10 small ops a row (at 200 sampled rows of a 259-token vocabulary with top-k, a
        third of the step), while a whole 32k-vocabulary batch at once streams every warper's pass through memory."""
        limit = max(1, _RUN_BYTES // (scores.shape[-1] * 4))
        run: list[int] = []
        key = None
        for i in rows:
            request = requests[i]
            params = request.params
            row_key = (tuple(id(p.processor) for p in request.processors.row_processors), params.temperature,
                       params.min_p, params.top_k, params.top_p)
            before, after = ghosts.get(i, NO_GHOSTS)
            if run and (row_key != key or len(run) == limit or before):
                self._draw_run(requests, logits, scores, run, tokens, errors)
                run = []
            draw_ghosts(before, scores)
            key = row_key
            run.append(i)
            if after:
                self._draw_run(requests, logits, scores, run, tokens, errors)
                run = []
                draw_ghosts(after, scores)
        if run:
            self._draw_run(requests, logits, scores, run, tokens, errors)

    @staticmethod
    def _draw_run(requests: Sequence[Request], logits: torch.Tensor, scores: torch.Tensor, members: list[int],
                  tokens: list[int | None], errors: list[Failure | None]) -> None:
        """One run: warp, record, draw. A warper that raises leaves the run untouched (no token, nothing recorded):
        its rows then go row by row, where a failure is its own request's."""
        first = requests[members[0]]
        params = first.params
        try:
            group = scores.index_select(0, torch.tensor(members, device=scores.device))
            for j, i in enumerate(members):  # stock's built-in min_new_tokens, before the request's processors
                request = requests[i]
                if len(request.output_ids) < request.params.min_new_tokens and request.params.eos_token_ids:
                    group[j, list(request.params.eos_token_ids)] = float("-inf")
            for warper in first.processors.row_processors:  # the same objects on every member
                group = warper(None, group)
            group = _warp(params, None, group)
            probs = torch.softmax(group.float(), dim=-1)
        except Exception:  # noqa: BLE001 -- row by row names the failing request
            return
        for j, i in enumerate(members):
            request = requests[i]
            if request.params.output_logits:
                request.logits.append(logits[i].clone())
            if request.params.output_scores:
                request.scores.append(group[j].clone())
        finite = torch.isfinite(probs).all(dim=-1).tolist()
        drawn = [j for j, ok in enumerate(finite) if ok]
        for j, ok in enumerate(finite):
            if not ok:
                errors[members[j]] = Failure.of(not_finite_error(params.temperature), "sampling failed")
        if drawn:
            picked = probs if len(drawn) == len(members) else probs[drawn]
            for j, token in zip(drawn, torch.multinomial(picked, num_samples=1).flatten().tolist()):
                tokens[members[j]] = token

    def _resample(self, request: Request, row: torch.Tensor) -> int:
        """Resample mode: pick from the unmasked row; keep the token when every constraint allows it, else mask the
        raw row and pick again (the masked distribution, see `constraint_modes.py`)."""
        raw = row.clone()  # the chain may edit the row in place; a refusal needs the raw logits
        token = self._pick(request, self._process_row(request, row))
        checks = resample_checks(request)
        stats = self.constraint_stats
        stats.num_constrained_tokens += 1
        stats.num_resampled_tokens += 1
        if all(check.allows(request.request_id, request.output_ids, token) for check in checks):
            return token
        stats.num_rejections += 1
        stats.num_masks_computed += 1
        request.num_masks_computed += 1
        for check in checks:
            raw = check.process_rows([request.request_id], [request.output_ids], raw)
        return self._pick(request, self._process_row(request, raw))

    def _count_masks(self, requests: Sequence[Request], rows: list[int], sampling: bool) -> None:
        """Mask mode's work: one mask per row a constraint masks (`sampling`: rows that pick a token now, not the
        drafted positions of a speculative verification)."""
        if not rows:
            return
        stats = self.constraint_stats
        stats.num_masks_computed += len(rows)
        if sampling:
            stats.num_constrained_tokens += len(rows)
            for i in rows:
                requests[i].num_masks_computed += 1

    def _process_row(self, request: Request, row: torch.Tensor, pending: Sequence[int] = ()) -> torch.Tensor:
        params = request.params
        history = None
        if len(request.output_ids) + len(pending) < params.min_new_tokens and params.eos_token_ids:
            row[:, list(params.eos_token_ids)] = float("-inf")  # stock's built-in, before the user's processors
        if params.logit_bias:  # then OpenAI's bias, processors, penalties, as vLLM (penalties.py)
            row = apply_logit_bias(row, params.logit_bias)
        for proc in request.processors.row_processors:  # the constraints were applied in the batched pass
            if history is None:
                prompt = request.prompt_ids if params.processor_prompt_ids is None else params.processor_prompt_ids
                history = torch.tensor([prompt + request.output_ids + list(pending)], dtype=torch.long,
                                       device=row.device)
            row = proc(history, row)
        if isinstance(row, torch.Tensor) and (params.presence_penalty or params.frequency_penalty):
            row = apply_output_penalties(row, params, request.output_ids, pending)
        return _warp(params, history, row) if params.do_sample else row

    def _pick(self, request: Request, row: torch.Tensor) -> int:
        if not isinstance(row, torch.Tensor):
            raise SamplingError(f"a logits processor returned {type(row).__name__}, not the scores tensor: return "
                                "the (edited) scores from its __call__")
        if not request.params.do_sample:
            return int(row.argmax(dim=-1))
        probs = torch.softmax(row.float(), dim=-1)
        if not bool(torch.isfinite(probs).all()):
            raise not_finite_error(request.params.temperature)
        return draw(request, probs, len(request.output_ids))  # a seeded row: keyed by its position



def _take_synced(agreed: list[int | None], tokens: list[int | None], errors: list[Failure | None]) -> None:
    """The first rank's verdict for each row, this rank's own failures kept where it failed there too."""
    for i, token in enumerate(agreed):
        if token is None and errors[i] is None:
            errors[i] = Failure("sampling failed on the first tensor-parallel rank")
        elif token is not None:
            errors[i] = None
        tokens[i] = token


def _warp(params, history: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
    """The request's own warpers (`SamplingParams` temperature, min-p, top-k, top-p): stock's order, with min-p after
    temperature as vLLM applies it."""
    if params.temperature != 1.0:
        scores = TemperatureLogitsWarper(params.temperature)(history, scores)
    if params.min_p:
        scores = MinPLogitsWarper(params.min_p)(history, scores)
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(history, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(history, scores)
    return scores


_RUN_BYTES = 1 << 20  # rows of logits warped at once: about a core's L2 (8 rows of a 32k vocabulary, 2 of 128k)


def not_finite_error(temperature: float) -> SamplingError:
    return SamplingError(
        f"the sampling distribution is not finite (temperature={temperature!r}): a temperature or penalty that "
        "overflows the logits, or a processor that wrote NaN; use a temperature >= 1e-5 (or greedy) and finite "
        "penalties"
    )


def _drawn_together(request: Request) -> bool:
    """A sampled row `_draw_together` may take: no stock processor but the warpers that read nothing but the row
    (others are called per row with its history), no seed (its own generator's stream must not depend on which rows
    share its step), no penalties (they read its history)."""
    return (request.params.do_sample and request.seed is None and request.params.seed is None
            and not has_penalties(request.params)
            and all(type(p.processor) in _ROW_ONLY_WARPERS for p in request.processors.row_processors))


# transformers' warpers whose result on a row depends on that row alone, not on `input_ids` (exact types: a subclass
# may read more)
_ROW_ONLY_WARPERS = frozenset((TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
                               TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper))


def plain_greedy_step(inputs, waiting_forks: Mapping[str, object]) -> bool:
    """A step whose every logits row only needs its argmax: plain greedy requests that ask no log-probabilities and
    have no forks waiting for their first token, no drafts, no scoring rows (`StepInputs`)."""
    return (bool(inputs.sampled_requests) and not inputs.scored and not any(inputs.num_draft_tokens)
            and all(is_plain_greedy(r) and r.params.logprobs is None and r.request_id not in waiting_forks
                    for r in inputs.sampled_requests))


def is_plain_greedy(request: Request) -> bool:
    """Greedy with nothing to apply: the token is the argmax of the raw logits (one batched argmax)."""
    params = request.params
    return (
        not params.do_sample
        and not request.processors
        and not has_penalties(params)
        and not params.output_scores
        and not params.output_logits
        and len(request.output_ids) >= params.min_new_tokens
    )

