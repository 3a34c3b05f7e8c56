"""`PagedMetadata`: what one packed forward needs to know about its requests, passed as a model kwarg.

The engine builds one per step; the step's attention backend (`attention_backends.choose_backend`) holds it and
reaches every attention call as the model kwarg `paged_backend`, so nothing per step lives in a global. It is a
value of the step: derived device tensors are memoised on it, but the plans of the backend live in the backend,
and no cache layer writes into it. Token pruning's question and answer (`observed`) and PyramidKV's hidden
positions (`hidden`) are the engine's, filled before the forward (and `observed.scores` during it, by attention);
`sparse_rows` is attention's answer to the engine: which chunks ran block-sparse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hf_paged.errors import UnsupportedModelError

__all__ = ["ObservedScores", "PagedMetadata"]


@dataclass(slots=True)
class ObservedScores:
    """Token pruning's question to attention and its answer (SnapKV, PyramidKV): the sequences whose last prompt
    queries are scored, and, after the forward, each layer's scores of their keys (`pruning.observation_scores`)."""

    queries: dict[int, int] = field(default_factory=dict)  # seq index -> how many of its last queries are scored
    scores: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # seq -> layer -> [context_len]

    def __bool__(self) -> bool:
        return bool(self.queries)

    def record(self, seq: int, layer: int, scores: torch.Tensor) -> None:
        self.scores.setdefault(seq, {})[layer] = scores

    def of(self, seq: int) -> dict[int, torch.Tensor]:
        """Layer -> scores of sequence `seq`, in the order the layers ran ({} when it was not observed)."""
        return self.scores.get(seq, {})


@dataclass(slots=True)
class PagedMetadata:
    """Per-step attention metadata of a packed ragged batch (batch size 1, requests concatenated)."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: flat slot of every new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32 (padded with 0)
    query_start_loc: list[int]  # num_seqs + 1 offsets of each request's new tokens in the packed batch
    context_lens: list[int]  # tokens in the cache per request after this step's tokens are stored
    block_size: int
    attention_backend: str = "auto"  # PagedConfig.attention_backend: "auto" (Triton on CUDA), "torch", "triton"
    # the CPU kernel variants loaded when the step was built (`cpu_warm.ready_variants`): a layer whose variant is
    # not among them takes the torch path, so a kernel that finishes loading mid-step is used from the next step
    cpu_kernels: frozenset = frozenset()
    _on_device: dict = field(default_factory=dict)  # (name, device) -> tensor
    observed: ObservedScores = field(default_factory=ObservedScores)  # token pruning's scored queries and scores
    hidden: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    # ^ PyramidKV: layer -> {seq index: table positions that layer must not see}
    stored: set = field(default_factory=set)  # the layers that stored this step's keys (each once: `store_once`)
    # the seq indices whose chunk some layer attended block-sparsely (filled during the forward by the backend,
    # `sparse_seqs`): the engine keeps the K/V they wrote, and all later K/V of those requests, out of the prefix cache
    sparse_rows: set = field(default_factory=set)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def max_query_len(self) -> int:
        return max(b - a for a, b in zip(self.query_start_loc, self.query_start_loc[1:]))

    def _get(self, name: str, device: torch.device, make) -> torch.Tensor:
        key = (name, device)
        tensor = self._on_device.get(key)
        if tensor is None:
            tensor = make().to(device, non_blocking=True)
            self._on_device[key] = tensor
        return tensor

    def store_once(self, layer: object) -> None:
        """A layer stores a step's keys once: a model whose layer calls its attention twice (DiffLlama: once per
        half of the values) would overwrite the first call's values with the second's, silently."""
        if id(layer) in self.stored:
            raise UnsupportedModelError("a layer called the paged attention twice in one forward (e.g. once per half "
                                        "of its values), which it cannot serve; use stock generate for this model")
        self.stored.add(id(layer))

    def slot_mapping_on(self, device: torch.device) -> torch.Tensor:
        return self._get("slot_mapping", device, lambda: self.slot_mapping)

    def block_tables_on(self, device: torch.device) -> torch.Tensor:
        return self._get("block_tables", device, lambda: self.block_tables)

    def query_start_loc_on(self, device: torch.device) -> torch.Tensor:
        return self._get("query_start_loc", device, lambda: torch.tensor(self.query_start_loc, dtype=torch.int32))

    def context_lens_on(self, device: torch.device) -> torch.Tensor:
        return self._get("context_lens", device, lambda: torch.tensor(self.context_lens, dtype=torch.int32))
