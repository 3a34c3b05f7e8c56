"""`KVPruner`: the engine side of token pruning (the policy, `PagedConfig.kv_pruning`, lives in
`hf_paged.cache.pruning`).

After each forward it drops blocks from the tables of the requests that need it:
- snapkv: a request whose prompt ended in this step, from the attention scores its last prompt queries left in
  the metadata of the steps that ran them (max over the chunks; the most interested head of any layer decides a
  block's score);
- pyramidkv: the same, per layer (see `hf_paged.cache.pruning`); `annotate` then hides, in each later step,
  the blocks a layer did not choose;
- streaming: any request whose table outgrew its budget by a block (sinks + most recent tokens kept).
It also decides which blocks may enter the prefix cache: only K/V a plain prefill of the same tokens writes, so a
request's blocks are offered once they are final (after SnapKV's selection, the table's leading blocks before the
first dropped one; only the sinks under streaming). Which blocks a request keeps never depends on the prefix cache:
shared blocks are dropped like private ones, and a prefix hit stops short of the prompt's observation window
(`Scheduler._cache_tokens`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_paged.batching.request import Request
from hf_paged.batching.scheduler import SchedulerOutput
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.pruning import (
    OBSERVATION_WINDOW,
    check_pruning,
    pooled_block_scores,
    prompt_budget_blocks,
    pyramid_budgets,
    select_blocks,
)
from hf_paged.config import PagedConfig


class KVPruner:
    def __init__(self, config: PagedConfig, kv: KVCacheManager, num_layers: int) -> None:
        check_pruning(config.kv_pruning, config.kv_keep_ratio, config.num_sink_tokens, config.window_tokens,
                       config.kv_budget_tokens)
        self.policy = config.kv_pruning
        self.config = config
        self.kv = kv
        self.num_dropped_blocks = 0  # blocks dropped so far (stats: kv_blocks_evicted)
        self.num_layers = num_layers
        # snapkv / pyramidkv: request id -> (the request, layer -> max observation scores of its prompt's chunks so far)
        self.pending: dict[str, tuple[Request, dict[int, torch.Tensor]]] = {}

    @property
    def observation_window(self) -> int:
        return OBSERVATION_WINDOW if self.policy in ("snapkv", "pyramidkv") else 0

    def annotate(self, schedule: SchedulerOutput, metadata: PagedMetadata) -> None:
        """PyramidKV: tell each layer which kept blocks of each request it must not see."""
        if self.policy != "pyramidkv":
            return
        bs = self.config.block_size
        for i, item in enumerate(schedule.scheduled):
            request = item.request
            if request.num_computed_tokens < len(request.prompt_ids):
                continue  # (re)computing its prompt: no selection applies yet
            layers = self.kv.hidden_blocks(request.request_id)  # (with the table: a fork's came with its parent's)
            for layer, blocks in (layers or {}).items():
                if blocks:
                    positions = (torch.tensor(blocks)[:, None] * bs + torch.arange(bs)).reshape(-1)
                    metadata.hidden.setdefault(layer, {})[i] = positions

    def budget_blocks(self, request: Request) -> int:
        c = self.config
        return prompt_budget_blocks(len(request.prompt_ids), c.kv_keep_ratio, c.block_size, c.kv_budget_tokens,
                                    c.num_sink_tokens, c.window_tokens)

    def after_forward(self, schedule: SchedulerOutput, metadata: PagedMetadata) -> None:
        if self.policy is None:
            return
        for i, item in enumerate(schedule.scheduled):
            request = item.request
            observed = metadata.observed
            if self.policy in ("snapkv", "pyramidkv") and i in observed.queries:
                layer_scores = self._observe(request, observed.of(i))
                if layer_scores is None:  # the prompt goes on in a later chunk
                    continue
                if self.policy == "snapkv":
                    scores = list(layer_scores.values())
                    self._prune(request, torch.stack(scores) if scores else None, window_only=False)
                else:
                    self._prune_pyramid(request, layer_scores)
            elif self.policy == "streaming":
                self._prune(request, None, window_only=True)

    def _observe(self, request: Request, layer_scores: dict[int, torch.Tensor]) -> dict[int, torch.Tensor] | None:
        """This chunk's observation scores merged into the request's earlier chunks' (max per key: each query's
        scores see only the keys up to it, so a query scores the same in any chunk); the merged scores once the
        prompt has ended, else None (kept for the next chunk)."""
        rid = request.request_id
        owner, merged = self.pending.pop(rid, (request, {}))
        if owner is not request:  # an earlier attempt under the same id (a retry): its scores are not this one's
            merged = {}
        for layer, s in layer_scores.items():
            s, old = s.cpu(), merged.get(layer)
            if old is not None:
                width = max(old.shape[-1], s.shape[-1])
                s = torch.maximum(F.pad(old, (0, width - old.shape[-1])), F.pad(s, (0, width - s.shape[-1])))
            merged[layer] = s
        if request.num_computed_tokens >= len(request.prompt_ids):
            return merged
        # requests that ended before their prompt did (aborted) leave nothing behind; swapped-out ones keep theirs
        self.pending = {r: entry for r, entry in self.pending.items() if not entry[0].ended}
        self.pending[rid] = (request, merged)
        return None

    def _prune(self, request: Request, token_scores: torch.Tensor | None, *, window_only: bool) -> None:
        c, rid = self.config, request.request_id
        num_tokens = self.kv.num_tokens(rid)
        budget = self.budget_blocks(request)
        bs = c.block_size
        if -(-num_tokens // bs) <= budget + (1 if window_only else 0):  # streaming: drop a block at a time
            return
        block_ids = self.kv.block_ids(rid)
        full = num_tokens // bs
        # Every full block may go, shared ones too (a prefix hit's, a fork's: the table only lets go of its
        # reference): which blocks a request keeps depends on its tokens, never on who else holds them, so a prompt
        # keeps the same blocks whatever the prefix cache held when it started (the h5 pass: kept shared blocks
        # took the budget and changed greedy output with the cache state)
        droppable = [i < full for i in range(len(block_ids))]
        # Streaming keeps the sinks and the most recent tokens that fit the budget.
        window = budget * bs - c.num_sink_tokens if window_only else c.window_tokens
        scores = pooled_block_scores(token_scores, bs) if token_scores is not None else None
        plan = select_blocks(num_tokens, bs, droppable, budget_blocks=budget, num_sink_tokens=c.num_sink_tokens,
                             window_tokens=window, block_scores=scores)
        self.kv.drop_blocks(rid, plan.drop_indices)
        self.num_dropped_blocks += len(plan.drop_indices)

    def _prune_pyramid(self, request: Request, layer_scores: dict[int, torch.Tensor]) -> None:
        """Each layer picks its own blocks under its own budget; the table keeps their union and every layer hides
        the union's blocks it did not pick."""
        c, rid, bs = self.config, request.request_id, self.config.block_size
        num_tokens = self.kv.num_tokens(rid)
        budget = self.budget_blocks(request)
        self.kv.set_hidden_blocks(rid, None)
        if -(-num_tokens // bs) <= budget or not layer_scores:
            return
        num_blocks = -(-num_tokens // bs)
        full = num_tokens // bs
        droppable = [i < full for i in range(num_blocks)]  # shared blocks too (`_prune`)
        floor = -(-(c.num_sink_tokens + c.window_tokens) // bs)
        chosen: dict[int, set[int]] = {}
        for layer, layer_budget in enumerate(pyramid_budgets(budget, self.num_layers, floor)):
            scores = pooled_block_scores(layer_scores[layer], bs) if layer in layer_scores else None
            plan = select_blocks(num_tokens, bs, droppable, budget_blocks=layer_budget,
                                 num_sink_tokens=c.num_sink_tokens, window_tokens=c.window_tokens, block_scores=scores)
            chosen[layer] = set(range(num_blocks)) - set(plan.drop_indices)
        union = set().union(*chosen.values())
        drop = [i for i in range(num_blocks) if i not in union]
        new_index = {old: new for new, old in enumerate(sorted(union))}
        self.kv.set_hidden_blocks(rid, {layer: sorted(new_index[j] for j in union - kept)
                                        for layer, kept in chosen.items()})
        self.kv.drop_blocks(rid, drop)
        self.num_dropped_blocks += len(drop)

    def cacheable_tokens(self, request: Request, token_ids: list[int]) -> list[int]:
        """The prefix of `token_ids` whose blocks may enter the prefix cache now."""
        if self.policy is None:
            return token_ids
        if self.policy in ("snapkv", "pyramidkv"):
            return token_ids if request.num_computed_tokens >= len(request.prompt_ids) else []
        sinks = -(-self.config.num_sink_tokens // self.config.block_size) * self.config.block_size
        return token_ids[:sinks]
