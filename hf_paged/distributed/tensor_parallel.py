"""Tensor parallelism: a model loaded with `from_pretrained(..., tp_plan="auto")` under `torchrun`, wrapped.

transformers' own tensor parallelism (DTensor) runs unchanged under the engine: every rank runs its own engine
on the same requests, the model's hooks split each forward and all-reduce inside it. Nothing here touches that.

    rank 0: engine (same schedule) ─ forward ─ q/k/v heads 0..h/2-1 ─ all-reduce ─ same logits ─ same tokens
    rank 1: engine (same schedule) ─ forward ─ q/k/v heads h/2..h-1 ─┘

Each rank's paged cache holds its own KV heads only (storage is created at the first update from the K/V it
receives). What this module adds:
- the block budget counts the local KV heads, and every rank gets the same number of blocks (the smallest any
  rank can afford): a rank with fewer blocks would preempt where the others do not, and their forwards, hence
  their collectives, would stop matching;
- refusals with the reason, for what cannot run (below).

The ranks stay in step because the engine is deterministic: the same requests, the same blocks, the same
schedule, the same (all-reduced) logits. Sampling draws on each rank from its own generator, so a step with a
sampled row ends with every rank taking the first rank's tokens (`token_sync`, one small broadcast): ranks
seeded differently, or not at all, stay in step (stock `generate` under tensor parallelism needs every rank seeded
alike, or its ranks feed their forwards different tokens).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from hf_paged.config import PagedConfig
from hf_paged.errors import InvalidConfigError, UnsupportedModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["check_tensor_parallel", "engine_config", "local_kv_heads", "tensor_parallel_size", "token_sync"]


def tensor_parallel_size(model: PreTrainedModel) -> int:
    """Ranks the model's layers are split over by transformers' tensor parallelism (1: not split)."""
    return int(getattr(model, "_tp_size", None) or 1)


def local_kv_heads(model: PreTrainedModel) -> int:
    """KV heads each rank holds (all of them when the plan does not split the key projections, e.g. Phi-3's
    gathered `qkv_proj`). Raises `UnsupportedModelError` when they cannot be split evenly."""
    text = model.config.get_text_config(decoder=True)
    num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    tp_size = tensor_parallel_size(model)
    if tp_size == 1:
        return num_kv_heads
    from transformers.distributed.tensor_parallel import get_kv_heads_per_rank

    local = get_kv_heads_per_rank(model.tp_plan, num_kv_heads, tp_size)
    if local is None or not isinstance(local, int):
        raise UnsupportedModelError(
            f"{type(model).__name__} has {num_kv_heads} KV heads (per layer), which tp_size={tp_size} "
            "does not divide: transformers' own attention cannot run this split either (its forward fails to "
            "reshape the local keys); load it with a tp_size that divides num_key_value_heads"
        )
    return local


def check_tensor_parallel(model: PreTrainedModel, config: PagedConfig) -> None:
    """Raise, saying why, when a tensor-parallel model (or these settings with it) cannot run on the engine.
    Nothing to check for a model that is not split."""
    if tensor_parallel_size(model) == 1:
        return
    name = type(model).__name__
    distributed = getattr(model.config, "distributed_config", None)
    for field in ("pp_size", "fsdp_size", "dp_replicate_size", "ep_size", "enable_sequence_parallel"):
        value = getattr(distributed, field, None)
        if value is True or (not isinstance(value, bool) and isinstance(value, int) and value > 1):
            raise UnsupportedModelError(
                f"{name} is loaded with {field}={value} beside tensor parallelism; hf_paged runs tensor parallelism "
                "alone, over every rank of the job (tested on CPU/gloo for Llama, Qwen2, Mistral, Gemma, Phi-3). "
                "Load it with tp_plan='auto' only"
            )
    local_kv_heads(model)
    for field in ("kv_streaming_heads", "kv_full_precision_heads"):
        if getattr(config, field) is not None:
            raise InvalidConfigError(
                f"PagedConfig.{field} names KV heads of the whole model, but under tensor parallelism each rank "
                f"holds {local_kv_heads(model)} of them; allowed with tensor parallelism: None"
            )
    if config.kv_pruning in ("snapkv", "pyramidkv"):
        raise InvalidConfigError(
            f"PagedConfig.kv_pruning={config.kv_pruning!r} keeps the blocks the most interested head scores "
            "highest, and each rank sees only its own heads: the ranks could keep different blocks, differ from one "
            "process and fall out of step; allowed with tensor parallelism: None or 'streaming'"
        )


def engine_config(model: PreTrainedModel, config: PagedConfig) -> PagedConfig:
    """The settings the engine of a tensor-parallel model is built with: `num_blocks` fixed to what the smallest
    rank's budget buys for its local KV heads. Unchanged when the model is not split or `num_blocks` is given
    (every rank then sizes alike). Every rank must call it (one small collective)."""
    tp_size = tensor_parallel_size(model)
    if tp_size == 1 or config.num_blocks is not None:
        return config
    import torch.distributed as dist

    from hf_paged.cache.paged_cache import PagedCache
    from hf_paged.cache.sizing import device_memory, kv_shape_of

    param = next(model.parameters())
    local_config = copy.deepcopy(model.config)
    local_config.get_text_config(decoder=True).num_key_value_heads = local_kv_heads(model)
    probe = PagedCache(local_config, config, dtype=param.dtype, device=param.device)  # sizes; allocates nothing
    num_blocks = probe.num_blocks
    total = device_memory(param.device).total
    if total is not None and not probe.compressed:
        # The engine checks the pool against the device counting every KV head (`check_fits_device`); stay under
        # that, or a budget above 1/tp_size of the device would be refused.
        num_blocks = min(num_blocks, total // kv_shape_of(model.config).bytes_per_block(probe.block_size, param.dtype))
    every: list[int | None] = [None] * tp_size
    dist.all_gather_object(every, int(num_blocks), group=_tp_group(model))
    return config.with_overrides(num_blocks=max(1, min(n for n in every if n is not None)))


def token_sync(model: PreTrainedModel):
    """For a split model, the sampler's `sync`: the first tensor-parallel rank's tokens, broadcast to the others
    (-1 for a row that failed there). None for a model that is not split."""
    if tensor_parallel_size(model) == 1:
        return None
    import torch
    import torch.distributed as dist

    group, device = _tp_group(model), next(model.parameters()).device

    def sync(tokens: list[int | None]) -> list[int | None]:
        agreed = torch.tensor([-1 if t is None else t for t in tokens], dtype=torch.long, device=device)
        dist.broadcast(agreed, group_src=0, group=group)
        return [None if t < 0 else t for t in agreed.tolist()]

    return sync


def _tp_group(model: PreTrainedModel):
    mesh = getattr(model, "_device_mesh", None)
    if mesh is not None and "tp" in (mesh.mesh_dim_names or ()):
        return mesh["tp"].get_group()
    return None  # the whole job
