"""Drafting with a smaller model: a mirror of each request in the draft model's own paged cache.

    target request    prompt + output                      | last token (not yet computed by the target)
    mirror (draft)    the same tokens, K/V computed up to the last one, then k - 1 drafts of the previous step
Each step: cut the mirror back to where it still agrees with the request (rejected drafts go, the K/V of kept
ones stays), compute what is new in one chunk and draw the first draft, then one decode step per further draft,
all requests batched per step. The draft model must share the target's tokenizer (its vocabulary may be padded
larger; ids past the target's are never drafted).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hf_paged.batching.model_runner import ModelRunner
from hf_paged.batching.request import Request
from hf_paged.batching.scheduler import ScheduledRequest, SchedulerOutput
from hf_paged.batching.seeded_draws import draw
from hf_paged.batching.speculative.draft import Draft
from hf_paged.batching.step_inputs import build_step_inputs
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.sizing import kv_shape_of
from hf_paged.compat import execution_device
from hf_paged.config import PagedConfig
from hf_paged.errors import UnsupportedGenerationError


class DraftModelProposer:
    """`Proposer` running `model` over its own `PagedCache` (`num_blocks` blocks of `block_size`, no prefix cache).

    Raises `UnsupportedModelError` for a model the engine cannot drive and `UnsupportedGenerationError` for a
    vocabulary smaller than the target's."""

    def __init__(self, model: torch.nn.Module, *, vocab_size: int, block_size: int, num_blocks: int,
                 attention_backend: str = "auto") -> None:
        from hf_paged.cache.model_support import check_supported

        check_supported(model)
        draft_vocab = int(model.config.get_text_config(decoder=True).vocab_size)
        if draft_vocab < vocab_size:
            raise UnsupportedGenerationError(
                f"the draft model's vocabulary has {draft_vocab} tokens, the model's {vocab_size}: a draft model "
                "must use the same tokenizer; pick one of the same family, or use prompt lookup (draft_model=None)"
            )
        param = next(model.parameters())
        config = PagedConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=False,
                             attention_backend=attention_backend)
        self.model = model
        self.vocab_size = vocab_size
        self.cache = PagedCache(model.config, config, dtype=param.dtype, device=execution_device(model))
        self.kv = self.cache.manager
        self.runner = ModelRunner(model, self.cache)
        self.max_model_len = kv_shape_of(model.config).max_model_len
        self.block_size = block_size
        self.attention_backend = attention_backend
        self._mirrors: dict[str, Request] = {}  # request id -> its mirror: prompt_ids = its tokens, output = drafts

    def propose(self, requests: Sequence[Request], num_tokens: Sequence[int]) -> list[Draft]:
        tokens: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        mirrors = [self._sync(r) for r in requests]
        busy = {r.request_id for r in requests}
        limits = [min(k, self.max_model_len - r.num_tokens) for r, k in zip(requests, num_tokens)]
        live = [i for i, limit in enumerate(limits) if limit > 0]
        while live:
            scheduled, members = [], []
            for i in live:
                mirror = mirrors[i]
                n = mirror.num_tokens_to_compute
                if len(tokens[i]) < limits[i] and self._allocate(mirror.request_id, n, busy):
                    scheduled.append(ScheduledRequest(mirror, n))
                    members.append(i)
            live = members
            if not scheduled:
                break
            inputs = build_step_inputs(SchedulerOutput(scheduled), self.kv, self.block_size, self.attention_backend)
            logits = self.runner.forward(inputs.input_ids, inputs.positions, inputs.metadata, inputs.logits_rows)
            logits = logits[:, : self.vocab_size]
            for item, i, row in zip(scheduled, members, logits):
                item.request.num_computed_tokens += item.num_tokens
                token, q = _draw(requests[i], row, len(requests[i].output_ids) + len(tokens[i]))
                item.request.output_ids.append(token)
                tokens[i].append(token)
                if q is not None:
                    probs[i].append(q)
        return [Draft(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs)]

    def _allocate(self, request_id: str, num_tokens: int, busy: set[str]) -> bool:
        """Slots for `num_tokens` more tokens of a mirror; when the pool is short, mirrors of requests not drafting
        now (waiting, preempted) go first, oldest first. False when that is not enough: the request drafts less."""
        while not self.kv.allocate_slots(request_id, num_tokens):
            idle = next((rid for rid in self._mirrors if rid not in busy), None)
            if idle is None:
                return False
            self.release(idle)
        return True

    def _sync(self, request: Request) -> Request:
        """The request's mirror, cut back to the longest prefix it shares with the request's tokens (at most all
        but the last token: the next forward must produce logits)."""
        tokens = request.all_token_ids
        rid = request.request_id
        mirror = self._mirrors.get(rid)
        if mirror is None:
            self.kv.add_sequence(rid)
            mirror = self._mirrors[rid] = Request(rid, tokens, request.params)
            return mirror
        base, drafted = len(mirror.prompt_ids), mirror.output_ids  # the request only grows: prompt_ids still agree
        new = tokens[base:]
        same = 0
        while same < len(new) and same < len(drafted) and new[same] == drafted[same]:
            same += 1
        keep = min(base + same, mirror.num_computed_tokens, len(tokens) - 1)
        self.kv.truncate(rid, keep)
        mirror.prompt_ids, mirror.output_ids, mirror.num_computed_tokens = tokens, [], keep
        return mirror

    def release(self, request_id: str) -> None:
        if self._mirrors.pop(request_id, None) is not None:
            self.kv.free(request_id)

    def check_integrity(self, live_ids: set[str]) -> None:
        self.cache.check_integrity()
        assert set(self._mirrors) == set(self.kv.seqs), "a draft mirror and its block table disagree"
        stale = set(self._mirrors) - live_ids
        assert not stale, f"the draft model keeps mirrors of ended requests {sorted(stale)[:5]}"
        for rid, mirror in self._mirrors.items():
            assert self.kv.num_tokens(rid) >= mirror.num_computed_tokens, f"mirror {rid!r}: K/V without slots"


def _draw(request: Request, row: torch.Tensor, position: int) -> tuple[int, torch.Tensor | None]:
    """The draft token for output position `position`: the argmax for greedy requests, else a draw from the draft's
    distribution (returned too); a seeded request's from the noise the model's own draw there will use (the coupled
    race of `seeded_draws.py`: the draft is kept when both rank the same token first)."""
    params = request.params
    if not params.do_sample:
        return int(row.argmax()), None
    q = torch.softmax(row.float() / params.temperature, dim=-1)
    return draw(request, q, position), q
