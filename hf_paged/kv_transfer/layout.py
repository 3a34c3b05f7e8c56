"""What a stored KV block must agree on with the engine that loads it: `BlockLayout`, and the model fingerprint.

A block's K/V are only meaningful to the same model (same weights), cut into the same block size, stored in the same
format (plain model dtype, or quantized with the same scales), with the same layers and KV heads. The layout names
all of these; a block whose header names another layout is refused field by field (`KVBlockMismatchError`), never
loaded. Stores key blocks by `namespace()` + block digest, so two models (or two formats of one model) sharing a
directory never even look at each other's files.

The fingerprint is computed from the weights themselves (names, shapes, dtypes and a checksum of every value of
every parameter and buffer, `weights_checksum.py`; a tensor-parallel rank reads its own shards, so each rank keys its
own heads' blocks), so it is the same after a restart of the same model and differs for other weights, down to one
changed value. The layout also names what the K/V were computed under besides the weights (`attention`: token
pruning, sparse prefill, head merging), so an engine never loads K/V its own prefill would not make.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
from dataclasses import asdict, dataclass, fields

import torch

from hf_paged.cache.compression.formats import BlockFormat
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.errors import KVBlockMismatchError
from hf_paged.kv_transfer.weights_checksum import tensor_checksum

__all__ = ["BlockLayout", "layout_of", "model_fingerprint"]


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """Everything a stored block must match to be loaded into an engine."""

    fingerprint: str  # the model's weights (`model_fingerprint`), hex
    block_size: int  # token slots per block
    num_layers: int  # decoder layers (one K and one V per layer)
    num_kv_heads: int  # KV heads each layer stores (a tensor-parallel rank: its own heads)
    head_dim: int
    dtype: str  # the model dtype the K/V arrived in, e.g. "float32"
    storage: str  # "plain", or the quantized formats of keys and values with their scale layout
    attention: str  # "full", or the pruning / sparse-prefill settings the K/V were computed under

    def namespace(self) -> bytes:
        """8 bytes naming this layout: the prefix of every store key (with the block digest after it)."""
        text = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(text, digest_size=8, person=b"hf_paged.layout").digest()

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self, stored: dict) -> None:
        """Raise `KVBlockMismatchError` naming the first field where a block's header `stored` differs."""
        for f in fields(self):
            ours, theirs = getattr(self, f.name), stored.get(f.name)
            if ours != theirs:
                what = "another model" if f.name == "fingerprint" else f"another {f.name.replace('_', ' ')}"
                raise KVBlockMismatchError(
                    f"stored KV block was made for {what}: {f.name}={theirs!r}, this engine has {ours!r}; it is not "
                    "loaded (the prefix is recomputed)"
                )


def model_fingerprint(model: torch.nn.Module) -> str:
    """Hex digest of what a model computes its keys and values from: its config (RoPE theta and scaling, head
    sizes, windows...; not the fields that only name or report things) and every parameter's and buffer's name,
    shape, dtype and a checksum of all its values (`tensor_checksum`; buffers: RoPE's inverse frequencies, which a
    config override recomputes on the same weights). Every tensor is read, the lm_head too (it feeds no K/V: a
    change there costs hits, never a wrong load).

    The same model gives the same fingerprint in every process (values are read, never addresses); any retraining
    (one value of one tensor), another checkpoint or another RoPE changes it. Costs one read of the weights where
    they are: about 240 ms of CPU time per GB on one core (`weights_checksum.py`)."""
    h = hashlib.blake2b(digest_size=16, person=b"hf_paged.model")
    config = getattr(model, "config", None)
    h.update(str(getattr(config, "model_type", type(model).__name__)).encode())
    if config is not None and hasattr(config, "to_dict"):
        fields = {k: v for k, v in config.to_dict().items()
                  if not k.startswith("_") and k not in _CONFIG_FIELDS_NOT_COMPUTED}  # (private: set per process)
        h.update(json.dumps(fields, sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, p in itertools.chain(model.named_parameters(), model.named_buffers()):
            h.update(f"{name}|{tuple(p.shape)}|{p.dtype}".encode())
            local = p.to_local() if hasattr(p, "to_local") else p  # a tensor-parallel DTensor: this rank's shard
            # (a reshape of the DTensor itself would gather across ranks)
            h.update(struct.pack("<Q", tensor_checksum(local)))
    return h.hexdigest()


# config fields that name, report or route things, never what a forward computes (a process may set them apart)
_CONFIG_FIELDS_NOT_COMPUTED = frozenset({
    "transformers_version", "architectures", "output_attentions", "output_hidden_states", "return_dict", "use_cache",
    "id2label", "label2id", "problem_type", "attn_implementation",
})


def _format_name(fmt: BlockFormat) -> str:
    parts = [fmt.name]
    parts += [flag for flag, on in (("channel", fmt.per_channel), ("head", fmt.per_head), ("log", fmt.log_scale),
                                    ("rope", bool(fmt.rope_frequencies))) if on]
    return "/".join(parts)


def attention_of(config) -> str:
    """What K/V were computed under besides the weights (`PagedConfig`): "full", or the settings of token pruning
    (streaming drops blocks during a long prefill, so later chunks attend to sinks and a window; SnapKV and PyramidKV
    compute a request's tokens after the prompt over the blocks they kept), of sparse prefill (an approximation) and
    of head merging (its table: a merged layer stores its representatives' key heads only, and its attention changes
    what every later layer computes). Blocks of one setting are never loaded by an engine with another. (Sparse
    prefill's own chunks never reach the prefix cache, whence blocks are exported: its part of the key is a guard,
    and keeps a sparse engine's blocks apart should that ever change.)"""
    parts = []
    if config.head_merge is not None:
        parts.append(f"head_merge={[list(layer) for layer in config.head_merge]}")
    if config.kv_pruning is not None:
        parts.append(f"pruning={config.kv_pruning}/keep={config.kv_keep_ratio}/budget={config.kv_budget_tokens}/"
                     f"sinks={config.num_sink_tokens}/window={config.window_tokens}")
    if config.sparse_prefill is not None:
        parts.append(f"sparse_prefill={config.sparse_prefill}/min={config.sparse_prefill_min_tokens}/"
                     f"keep={config.sparse_keep_ratio}")
    return ";".join(parts) or "full"


def layout_of(cache: PagedCache, fingerprint: str, dtype: torch.dtype) -> BlockLayout:
    """The layout of the blocks `cache` stores for the model with `fingerprint`, K/V in `dtype`."""
    shape = cache.kv_shape
    storage = "plain"
    if cache.compressed:
        full = cache.paged_config.kv_full_precision_heads
        storage = f"k={_format_name(cache.key_format)};v={_format_name(cache.value_format)};full_heads={full}"
    return BlockLayout(fingerprint, cache.block_size, shape.num_layers, shape.num_kv_heads, shape.head_dim,
                       str(dtype).removeprefix("torch."), storage, attention_of(cache.paged_config))
