"""Before any rank generates: every rank states what it was asked and whether it got ready, and all agree or all
raise the same error. One small collective, no per-step cost.

    rank r: CallSignature(inputs digest, settings digests, plan digest, error) ─ all_gather_object ─ agree() on each

Why one exchange carries the errors too: a rank that raised before the exchange (an input that is not token ids,
a `sampling_params` list of the wrong length, a model not wrapped on that rank) would leave the others waiting in
the collective until the process group's timeout (30 minutes by default), or pair its next collective with theirs.
Why the settings: each rank generates its own shard, so a rank given another temperature, seed or `do_sample`
would return its shard generated otherwise, silently mixed into every rank's outputs (and under tensor
parallelism the ranks would fall out of step).
"""

from __future__ import annotations

import dataclasses
import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hf_paged.batching.weights import sample_values
from hf_paged.errors import InvalidConfigError

__all__ = ["CallSignature", "agree", "exchange", "inputs_digest", "raise_any_error", "settings_digests",
           "weights_settings", "wrap_settings"]

# Arguments that may differ between ranks: they change nothing but what this rank shows (rank 0 alone draws the bar).
_LOCAL_ONLY = frozenset({"progress_bar"})
# PagedConfig fields each rank may set for itself: its memory, its own disk tier, its graphs; no output changes.
_PER_RANK_FIELDS = frozenset({"num_blocks", "max_cache_bytes", "memory_fraction", "kv_huge_pages", "kv_offload_dir",
                              "kv_offload_bytes", "cuda_graphs", "cache_salt"})
_WRAP = "PagedConfig."  # the prefix of the wrap's settings among a signature's `settings`
_WEIGHTS = "model weights"


@dataclass(slots=True)
class CallSignature:
    """What one rank was asked, as digests (never the prompts themselves), and whether it got ready."""

    num_inputs: int
    inputs: str  # digest of every input's token ids
    settings: tuple[tuple[str, str], ...]  # (argument, digest of its value), every argument but progress_bar
    plan: str | None  # digest of the shard plan and output budgets (None where `error` is set)
    error: BaseException | None = None  # what this rank raised getting ready (sent to every rank)


def inputs_digest(prompts: Sequence[Sequence[int]]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for prompt in prompts:
        digest.update(len(prompt).to_bytes(8, "little"))
        digest.update(array("q", prompt).tobytes())
    return digest.hexdigest()


def settings_digests(model, generation_config, kwargs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A digest of each generation argument (the model's own `generation_config` when none is given). Values are
    compared by content; processors, tokenizers, draft models and validators by their class only (they may hold
    per-rank state: a device, a counter)."""
    given = {name: value for name, value in kwargs.items() if name not in _LOCAL_ONLY}
    if generation_config is None and kwargs.get("sampling_params") is None:
        given["model.generation_config"] = model.generation_config
    else:
        given["generation_config"] = generation_config
    return tuple((name, hashlib.blake2b(_describe(value).encode(), digest_size=8).hexdigest())
                 for name, value in sorted(given.items()))


def wrap_settings(config) -> tuple[tuple[str, str], ...]:
    """The wrap's `PagedConfig` fields that change what a rank generates (KV dtype, pruning, head merging, sparse
    prefill, block size, scheduling...), each as `(PagedConfig.<field>, its value's text)`: a rank wrapped otherwise
    would return its shard generated otherwise (h8: one rank's int4 KV, silently mixed in)."""
    return tuple((_WRAP + f.name, _describe(getattr(config, f.name))[:200]) for f in dataclasses.fields(config)
                 if f.name not in _PER_RANK_FIELDS)


def weights_settings(model) -> tuple[tuple[str, str], ...]:
    """The weights' names, shapes and dtypes and a few values of the first, middle and last parameter (the sample
    `batching.weights` watches): a rank holding another checkpoint would return its shard from another model. Not
    a checksum of every value (`kv_transfer.layout.model_fingerprint` reads every byte: ~0.25 s per GB, every
    call); data parallel only (tensor-parallel ranks hold different shards)."""
    params = list(model.named_parameters())
    picks = [p for _, p in params[:1] + params[len(params) // 2:][:1] + params[-1:] if not p.is_meta]
    with torch.no_grad():
        text = repr(([(n, tuple(p.shape), str(p.dtype)) for n, p in params], [sample_values(p) for p in picks]))
    return ((_WEIGHTS, hashlib.blake2b(text.encode(), digest_size=8).hexdigest()),)


def _describe(value: Any, depth: int = 0) -> str:
    """A deterministic text of `value`'s content (the same on every rank for equal settings)."""
    from transformers import GenerationConfig

    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    if isinstance(value, GenerationConfig):
        value = value.to_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # SamplingParams
        return type(value).__name__ + _describe({f.name: getattr(value, f.name) for f in dataclasses.fields(value)},
                                                depth)
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        raw = data.reshape(-1).view(torch.uint8).numpy().tobytes()  # (bytes: numpy has no bfloat16)
        return f"tensor{tuple(data.shape)}{data.dtype}:{hashlib.blake2b(raw).hexdigest()}"
    if depth < 4 and isinstance(value, Mapping):
        items = sorted((repr(k), _describe(v, depth + 1)) for k, v in value.items())
        return "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    if depth < 4 and isinstance(value, list | tuple):
        return "[" + ",".join(_describe(v, depth + 1) for v in value) + "]"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def exchange(mine: CallSignature, group, size: int) -> list[CallSignature]:
    """Every rank's signature (the call's first collective). A rank of the group that never calls, or calls fewer
    times, leaves the others here until the process group's timeout: they then raise `InvalidConfigError` saying so,
    instead of the backend's bare timeout (the wait itself is the backend's: no collective can tell a late rank from
    one that will never come, so the bound is the group's timeout, set with `init_process_group(timeout=...)`)."""
    import torch.distributed as dist

    every: list[Any] = [None] * size
    try:
        dist.all_gather_object(every, mine, group=group)
    except RuntimeError as exc:  # (DistBackendError and gloo's timeouts and closed connections are RuntimeErrors)
        raise InvalidConfigError(
            f"rank {dist.get_rank()}: not every rank of the group ({size} ranks) joined this "
            f"hf_paged.distributed.generate_batch within the process group's timeout, or one left ({exc}); call it "
            "on every rank, the same number of times, with the same inputs (a rank that skips a call leaves the "
            "others waiting for that timeout: init_process_group(timeout=...))"
        ) from exc
    return every


def raise_any_error(every: Sequence[Any], rank: int, when: str = "") -> None:
    """Raise this rank's own `error` if it has one, else the first other rank's, with a note naming that rank: each
    item of `every` is one rank's (a `CallSignature`, a rank's results), all ranks holding the same list."""
    if every[rank].error is not None:
        raise every[rank].error
    for r, item in enumerate(every):
        if item.error is not None:
            item.error.add_note(f"(raised on rank {r} of {len(every)}{when})")
            raise item.error


def agree(every: Sequence[CallSignature], rank: int) -> None:
    """Raise, on every rank alike, when a rank failed getting ready or the ranks were asked different things."""
    raise_any_error(every, rank, " before generating; every rank raises it")
    if len({(s.num_inputs, s.inputs) for s in every}) > 1:
        counts = ", ".join(f"rank {r}: {s.num_inputs} inputs" for r, s in enumerate(every))
        raise InvalidConfigError(
            f"the ranks were given different inputs ({counts}, digests differ); hf_paged.distributed.generate_batch "
            "shards them itself: give every rank the whole list (not a per-rank split of it)"
        )
    differing = _differing(every)
    wrap = [name for name in differing if name.startswith(_WRAP)]
    if wrap:
        values = "; ".join(f"{name}: " + ", ".join(f"rank {r}: {dict(s.settings).get(name)}" for r, s in
                                                   enumerate(every)) for name in wrap)
        raise InvalidConfigError(
            f"the ranks wrapped the model with different settings ({values}): each rank generates its own share, "
            "which would come back generated otherwise; every rank must wrap with the same hf_paged.wrap options"
        )
    if _WEIGHTS in differing:
        raise InvalidConfigError(
            "the ranks hold different weights (their names, shapes, dtypes or sampled values differ): each rank "
            "generates its own share with its own copy; load the same checkpoint on every rank"
        )
    if differing:
        raise InvalidConfigError(
            f"the ranks were given the same inputs with different generation settings ({', '.join(differing)} "
            "differ between ranks): each rank generates its own share, which would come back generated otherwise; "
            "call generate_batch with the same settings on every rank"
        )
    if len({s.plan for s in every}) > 1:
        raise InvalidConfigError(
            "the ranks planned different shards for the same inputs and settings (wrapped with a different "
            "block_size, or different max_new_tokens in the model's generation_config): every rank must wrap with "
            "the same hf_paged.wrap options"
        )


def _differing(every: Sequence[CallSignature]) -> list[str]:
    per_rank = [dict(s.settings) for s in every]
    names = set().union(*per_rank)
    return sorted(name for name in names if len({settings.get(name) for settings in per_rank}) > 1)
