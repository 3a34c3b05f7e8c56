"""Verification: the model's own choice at each drafted position decides which drafts are kept.

    last token t, drafts d0 d1 d2: one forward gives the model's logits after t, d0, d1 and d2
        rows       r0   r1   r2   r3
        greedy     keep d0 if argmax(r0) == d0, then d1 against r1, ...; the first mismatch is replaced by the
                   argmax; when all are kept, r3's argmax comes as a bonus
        sampling   keep d_j with probability min(1, p_j(d_j) / q_j(d_j)), q_j the draft's distribution (a point
                   mass for prompt lookup); on the first rejection draw from norm(max(0, p_j - q_j)); all kept:
                   draw the bonus from p_3 (Leviathan et al. 2023, Chen et al. 2023)
        seeded     the seeded race at each position (seeded_draws.py): keep d_j while it is the race's winner over
                   p_j; the first winner that is not the draft, or r3's, is the model's token
A step emits the kept drafts and one token of the model's own: greedy or seeded, exactly the tokens one-at-a-time
decoding gives (whatever was drafted, however many drafts the step verified); unseeded, tokens of the same
distribution. Processors and warpers score position j with the drafts before it
as pending history, and only when those drafts were all kept: a processor's per-request state (a grammar's
automaton) only ever sees a prefix of the final output, so it needs no rollback, and a draft its mask forbids is
rejected like any other.

Log-probabilities (`SamplingParams.logprobs`): emitted token j of a request is read from row `first + j`, the raw
logits it was judged against (kept drafts and the model's own token alike), in one log_softmax of every such row
of the step; what decoding one token at a time would report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hf_paged.batching.logprobs import RowLogprobs, TokenLogprobs
from hf_paged.batching.request import Failure, Request
from hf_paged.batching.sampler import Sampler, is_plain_greedy, not_finite_error
from hf_paged.batching.seeded_draws import draw, request_seed
from hf_paged.errors import SamplingError


@dataclass(slots=True)
class DraftRows:
    """The logits of the requests that drafted this step."""

    requests: list[Request]
    logits: torch.Tensor  # [sum(1 + k_i), vocab] fp32: after each request's last token, then after each draft
    first_rows: list[int]  # row of each request's last token in `logits`; its drafts' rows follow
    num_drafts: list[int]  # k_i: the drafts verified are `request.draft_ids[:k_i]`


@dataclass(slots=True)
class Verdict:
    """What verification decided for one request."""

    token_ids: list[int]  # the kept drafts, then the model's own next token (empty when `error`)
    num_drafted: int  # drafts verified
    num_accepted: int  # of which kept
    error: Failure | None = None  # a processor failed or left no distribution: the request fails
    logprobs: list[TokenLogprobs] | None = None  # params.logprobs: one entry per token of `token_ids`


def verify(rows: DraftRows, sampler: Sampler) -> list[Verdict]:
    """One `Verdict` per request of `rows`. Plain greedy requests take one batched argmax; the others (processors,
    sampling, recorded scores) go position by position."""
    verdicts: list[Verdict | None] = [None] * len(rows.requests)
    greedy = [i for i, r in enumerate(rows.requests) if is_plain_greedy(r)]
    if greedy:
        choices = rows.logits.argmax(dim=-1).tolist()
        for i in greedy:
            first, k = rows.first_rows[i], rows.num_drafts[i]
            drafts = rows.requests[i].draft_ids
            kept = 0
            while kept < k and drafts[kept] == choices[first + kept]:
                kept += 1
            verdicts[i] = Verdict(drafts[:kept] + [choices[first + kept]], k, kept)
    others = [i for i in range(len(rows.requests)) if verdicts[i] is None]
    if others:
        _verify_in_order(rows, others, sampler, verdicts)
    _add_logprobs(rows, verdicts)  # type: ignore[arg-type]  # every slot is filled
    return verdicts  # type: ignore[return-value]


def _add_logprobs(rows: DraftRows, verdicts: list[Verdict]) -> None:
    """Each emitted token's entry from the raw row it was judged against, for the requests that ask."""
    asking = [i for i, r in enumerate(rows.requests) if r.params.logprobs is not None and verdicts[i].token_ids]
    if not asking:
        return
    index = [rows.first_rows[i] + j for i in asking for j in range(len(verdicts[i].token_ids))]
    ks = [rows.requests[i].params.logprobs for i in asking for _ in verdicts[i].token_ids]
    entries = RowLogprobs.of(rows.logits, index, ks).tokens([t for i in asking for t in verdicts[i].token_ids])
    at = 0
    for i in asking:
        count = len(verdicts[i].token_ids)
        verdicts[i].logprobs = entries[at : at + count]  # type: ignore[assignment]  # every token was picked
        at += count


def _verify_in_order(rows: DraftRows, members: list[int], sampler: Sampler, verdicts: list) -> None:
    """Position j = 0, 1, ... for the requests whose drafts before j were all kept, batched per position."""
    kept: dict[int, list[int]] = {i: [] for i in members}
    alive, j = members, 0
    while alive:
        requests = [rows.requests[i] for i in alive]
        index = torch.tensor([rows.first_rows[i] + j for i in alive], device=rows.logits.device)
        scores = rows.logits.index_select(0, index)  # a copy: processors edit it in place
        processed = sampler.process(requests, scores, [kept[i] for i in alive])
        still = []
        for pos, (i, request) in enumerate(zip(alive, requests)):
            k = rows.num_drafts[i]
            row = processed.rows[pos]
            if row is None:
                verdicts[i] = Verdict([], k, 0, processed.errors[pos])
                continue
            params = request.params
            if params.output_logits:
                request.logits.append(rows.logits[rows.first_rows[i] + j].clone())
            if params.output_scores:
                request.scores.append(row[0].clone())
            draft = request.draft_ids[j] if j < k else None
            if params.do_sample:
                q = request.draft_probs[j] if draft is not None and request.draft_probs is not None else None
                try:
                    token, accepted = _judge_sampled(request, row[0], draft, q, len(request.output_ids) + j)
                except SamplingError as exc:  # as decoding one token at a time: the request fails, the step goes on
                    verdicts[i] = Verdict([], k, 0, Failure.of(exc, "sampling failed"))
                    continue
            else:
                token = int(row[0].argmax())
                accepted = token == draft
            if accepted:
                kept[i].append(token)
                still.append(i)
            else:
                verdicts[i] = Verdict(kept[i] + [token], k, len(kept[i]))
        alive, j = still, j + 1


def _judge_sampled(request: Request, row: torch.Tensor, draft: int | None, q: torch.Tensor | None,
                   position: int) -> tuple[int, bool]:
    """(token, whether it is the kept draft) for output position `position`. A seeded request takes the seeded
    race's winner over the model's distribution and keeps the draft when it is that winner (`seeded_draws.py`: the
    tokens of decoding one at a time, whatever was drafted); an unseeded one, rejection sampling of `draft`."""
    probs = torch.softmax(row.float(), dim=-1)
    if not bool(torch.isfinite(probs).all()):  # (the seeded race would take a token from NaN, multinomial raise)
        raise not_finite_error(request.params.temperature)
    if request_seed(request) is not None:
        token = draw(request, probs, position)
        return token, draft is not None and token == draft
    if draft is None:  # every draft kept: the bonus token, from the model's own distribution
        return int(torch.multinomial(probs, 1)), False
    p_draft = float(probs[draft])
    q_draft = 1.0 if q is None else float(q[draft])
    u = float(torch.rand(1, device=probs.device))
    if q_draft > 0 and u * q_draft < p_draft:  # u < p / q, with probability min(1, p / q)
        return draft, True
    if q is None:
        residual = probs.clone()
        residual[draft] = 0.0  # norm(max(0, p - q)) for a point mass q on the draft
    else:
        residual = (probs - q.to(probs.device, probs.dtype)).clamp_(min=0.0)
    if not float(residual.sum()) > 0.0:  # p == q up to rounding: nothing left to correct
        residual = probs
    return int(torch.multinomial(residual, 1)), False
