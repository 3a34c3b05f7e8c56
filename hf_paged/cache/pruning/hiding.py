"""PyramidKV's per-layer view: the kept blocks a layer did not choose, masked out of its attention plan."""

from __future__ import annotations

import torch

from hf_paged.cache.kernels.reference import AttentionPlan, DecodeGroup, PrefillGroup, span_tail, uncascade


def hide_positions(plan: AttentionPlan, hidden: dict[int, torch.Tensor], query_start_loc: list[int],
                   context_lens: list[int], block_size: int) -> AttentionPlan:
    """A copy of `plan` where sequence i's queries do not see the table positions `hidden[i]` (PyramidKV: blocks
    another layer kept but this one did not choose)."""
    row_of = {query_start_loc[i]: i for i in hidden}
    prefills = []
    for g in plan.prefills:
        i = row_of.get(g.q_start)
        if i is None:
            prefills.append(g)
            continue
        q_len, c = g.q_end - g.q_start, context_lens[i]
        mask = g.mask.clone() if g.mask is not None else torch.ones(q_len, c, dtype=torch.bool).tril(c - q_len)
        mask[:, hidden[i].to(mask.device)] = False
        prefills.append(PrefillGroup(g.q_start, g.q_end, g.slots, mask))
    decodes = []
    for d in plan.decodes:
        seqs = [row_of.get(r) for r in d.rows.tolist()]
        if all(i is None for i in seqs):
            decodes.append(d)
            continue
        d = uncascade(d, block_size)  # hidden positions count from block 0, shared blocks included
        shape = (d.rows.numel(), 1, 1, d.max_blocks * block_size)  # columns: table positions (whole blocks)
        mask = d.mask.clone() if d.mask is not None else torch.ones(shape, dtype=torch.bool, device=d.rows.device)
        invalid = d.invalid
        if d.span is not None:  # rows read as slices: with a mask, their blocks are read whole (tail zeroed)
            mask[..., : d.span.start] = False
            mask[..., d.span.end :] = False
            invalid = span_tail(d, block_size)
        for r, i in enumerate(seqs):
            if i is not None:
                mask[r, 0, 0, hidden[i].to(mask.device)] = False
        decodes.append(DecodeGroup(d.rows, d.blocks, d.max_blocks, invalid, mask))
    return AttentionPlan(plan.num_query_tokens, prefills, decodes)
