"""`ModelRunner`: one packed forward of a stock transformers model over the paged cache.

    input_ids    [1, T]  the new tokens of every scheduled request, concatenated (no padding)
    position_ids [1, T]  each request continues at its own logical position
    paged_backend        the step's attention backend over its `PagedMetadata` (slots, block tables, context
                         lengths), chosen once per step (`cache/attention_backends.py`); reaches every cache.update
                         and attention call
    logits_to_keep       only the rows that need a next token

A decode step (every request one token, every row sampled) on CUDA replays a CUDA graph of the lean forward
instead (`decode_graphs.py`, `PagedConfig.cuda_graphs`); every other step runs eagerly.
"""

from __future__ import annotations

import functools

import torch

from hf_paged.batching.certified_head import CertifiedArgmax
from hf_paged.batching.decode_graphs import DecodeGraphs
from hf_paged.batching.lean_forward import LeanForward, _head
from hf_paged.cache.attention import ATTENTION_NAME, attend_packed, register
from hf_paged.cache.attention_backends import TorchBackend, choose_backend
from hf_paged.cache.attention_switch import attention_configs, use_attention
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.sparse_prefill import SparsePrefill
from hf_paged.compat import execution_device


def _autocast_off(method):
    """Run a forward of the runner with autocast off for its device, whichever thread steps: the pool holds the
    weights' dtype, and under autocast the projections return another (a fresh pool failed: keys fp32, values bf16;
    a pool in use stored rounded values). A forward that turns autocast on itself (accelerate's mixed-precision
    wrapper of `model.forward`) is refused by the api before any request (`api/autocast.py`)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        device = self.device.type
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):  # (~0.3 us when off)
            with torch.autocast(device, enabled=False):
                return method(self, *args, **kwargs)
        return method(self, *args, **kwargs)
    return run


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cache: PagedCache) -> None:
        register()
        self.model = model
        self.cache = cache
        self._configs = attention_configs(model)
        self.device = _input_device(model)
        self.sparse = SparsePrefill.from_config(cache.paged_config)  # long prefill chunks block-sparse (or None)
        self.lean = LeanForward.build(model)
        self.graphs = self._decode_graphs()
        self.certified = self._certified()

    def model_changed(self) -> None:
        """The weights or modules changed (the engine's weights check): build the lean forward (and the decode
        graphs, which recorded its tensors) anew."""
        self.lean = LeanForward.build(self.model)
        self.graphs = self._decode_graphs()
        self.certified = self._certified()

    def _certified(self) -> CertifiedArgmax | None:
        """Greedy rows' tokens from the bf16 head with a proof (`certified_head.py`): the lean forward on the CPU, a
        head it applies to, `PagedConfig.certified_argmax` not False."""
        if self.cache.paged_config.certified_argmax is False or self.lean is None:
            return None
        if not CertifiedArgmax.applies(self.lean.head, forced=bool(self.cache.paged_config.certified_argmax)):
            return None
        return CertifiedArgmax(self.lean.head, rows_independent=self.lean.prune, background=True)

    def _decode_graphs(self) -> DecodeGraphs | None:
        """Decode graphs where they can apply: CUDA, the lean forward, Triton attention, not turned off."""
        cfg = self.cache.paged_config
        if (cfg.cuda_graphs is False or self.lean is None or self.device.type != "cuda"
                or cfg.attention_backend == "torch"):
            return None
        width = min(self.cache.num_blocks, -(-self.cache.kv_shape.max_model_len // cfg.block_size))
        return DecodeGraphs(self.lean, self.cache.block_layers, device=self.device, block_size=cfg.block_size,
                            max_batch=cfg.max_num_seqs, max_blocks_per_seq=width,
                            attention_backend=cfg.attention_backend)

    @_autocast_off
    @torch.inference_mode()
    def greedy_tokens(
        self, input_ids: list[int], positions: list[int], metadata: PagedMetadata, logits_rows: list[int]
    ) -> list[int]:
        """Each logits row's argmax, for a step whose rows are all plain greedy: the same tokens as `forward`'s
        logits would give, by way of the certified bf16 head where it applies (`certified_head.py`)."""
        if self.certified is None or not self.lean.usable():  # (CPU only: no decode graphs there)
            return self.forward(input_ids, positions, metadata, logits_rows).argmax(dim=-1).tolist()
        self.cache.apply_pending_copies()
        ids, pos, keep, backend = self._packed(input_ids, positions, metadata, logits_rows)
        hidden = self.lean.hidden(ids, pos, keep, self._paged_attend(backend))
        tokens = self.certified.tokens(hidden)  # None while its copy of the head is made in the background
        return tokens if tokens is not None else _head(self.lean.head, hidden).argmax(dim=-1).tolist()

    def _packed(self, input_ids: list[int], positions: list[int], metadata: PagedMetadata, logits_rows: list[int]):
        """The step's tensors `[1, T]` ids and positions, `[R]` kept rows, and its attention backend."""
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        pos = torch.tensor([positions], dtype=torch.long, device=self.device)
        keep = torch.tensor(logits_rows, dtype=torch.long, device=self.device)
        return ids, pos, keep, choose_backend(metadata, self.cache.block_layers, self.device, self.sparse)

    def paged_attention(self):
        """Route attention to `hf_paged` for one forward only; plain forwards keep the stock implementation."""
        return use_attention(self._configs, ATTENTION_NAME)

    @_autocast_off
    @torch.inference_mode()
    def forward(
        self, input_ids: list[int], positions: list[int], metadata: PagedMetadata, logits_rows: list[int]
    ) -> torch.Tensor:
        """Returns fp32 logits `[len(logits_rows), vocab]`."""
        self.cache.apply_pending_copies()
        usable = self.lean is not None and self.lean.usable()
        if usable and self.graphs is not None and self.graphs.serves(len(input_ids), metadata, logits_rows):
            logits = self.graphs.run(input_ids, positions, metadata)
            if logits is not None:
                return logits.float()
        ids, pos, keep, backend = self._packed(input_ids, positions, metadata, logits_rows)
        if usable:
            return self.lean(ids, pos, keep, self._paged_attend(backend)).float()
        with self.paged_attention():
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                cache=self.cache,
                use_cache=True,
                paged_backend=backend,
                logits_to_keep=keep,
            )
        return out.logits[0].float()

    def _paged_attend(self, backend: TorchBackend):
        """The lean forward's attention: the stock attention module's, with the cache and "hf_paged"."""

        def attend(attn, q, k, v, scaling, sliding_window):
            return attend_packed(backend, attn, q, k, v, scaling=scaling, sliding_window=sliding_window)

        return attend


def _input_device(model: torch.nn.Module) -> torch.device:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight") and not embeddings.weight.is_meta:
        return embeddings.weight.device
    return execution_device(model)  # (embeddings offloaded by accelerate: its hooks move them where they compute)
