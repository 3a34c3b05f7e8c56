"""KV blocks that move between engines and tiers: a connector at the engine boundary, its block format and stores.

    layout.py        BlockLayout (model fingerprint, block size, layers, KV heads, dtype, storage format, attention)
    weights_checksum.py  tensor_checksum: every value of a tensor in one integer pass (the fingerprint's part)
    block_format.py  one block as bytes: header, tensors as stored, checksum
    codec.py         the engine's swap copies (`PagedCache.save_blocks`) <-> one block's named tensors
    stores.py        KVStore: InProcessStore (a dict), DirectoryStore (a file per block, bounded, LRU)
    dir_lock.py      one process per KV directory: a flock on its .lock file, counted per process
    failure_log.py   FailureLog: store and connector failures counted by kind, the first of each logged
    ray_store.py     RayObjectStore: blocks in Ray's object store, found through a named KVBlockDirectory actor
                     (leases counted in blocks and bytes); ray imported only when one is built
    fetcher.py       reading and checking a sequence's blobs, at once or in a worker thread
    write_behind.py  WriteBehindStore: saves queued (bounded by bytes) and written by a background thread
    saver.py         the save half: blocks copied out of the pool, handed to the store or the write queue
    request_digests.py  a waiting request's block digests, hashed once
    cost_model.py    TransferCostModel: load only when bytes / bandwidth < tokens / prefill speed (both measured)
    step_times.py    StepTimes: a decode-only step and what prompt work adds to it (fixed + per token + per query x
                     key pair), fitted on the engine's timed steps; fit_chunk: a chunk cut to a step's time share
    hot_blocks.py    PeerStore + HotBlockPublisher: colocated replicas publish blocks of local prefix hits and load
                     each other's (`save_on="hot"`, `hf-paged serve --replicas N --kv-share`)
    leases.py        LeasedStore: blocks put for another engine that nobody collects are freed (bounded)
    connector.py     KVConnector: the scheduler half (how many blocks the store holds, read them, load them) and the
                     worker half (write into the pool; save on store or eviction)

The engine builds one with `connector_for` (`PagedConfig.kv_offload_dir`: the disk tier; `Engine(kv_store=...)`:
another store, written through).
"""

from __future__ import annotations

import torch

from hf_paged.cache.digests import prefix_digests
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.config import PagedConfig
from hf_paged.errors import InvalidConfigError
from hf_paged.kv_transfer.block_format import DecodedBlock, decode_block, encode_block
from hf_paged.kv_transfer.connector import SAVE_POLICIES, KVConnector, KVTransferStats
from hf_paged.kv_transfer.cost_model import TransferCostModel
from hf_paged.kv_transfer.hot_blocks import HotBlockPublisher, PeerStore
from hf_paged.kv_transfer.layout import BlockLayout, layout_of, model_fingerprint
from hf_paged.kv_transfer.leases import LeasedStore
from hf_paged.kv_transfer.ray_store import KVBlockDirectory, RayObjectStore
from hf_paged.kv_transfer.step_times import ChunkFit, StepCost, StepTimes, fit_chunk
from hf_paged.kv_transfer.stores import DirectoryStore, InProcessStore, KVStore, expand_path
from hf_paged.kv_transfer.write_behind import WriteBehindStore, flush_writes_to

__all__ = [
    "SAVE_POLICIES",
    "BlockLayout",
    "ChunkFit",
    "DecodedBlock",
    "DirectoryStore",
    "HotBlockPublisher",
    "InProcessStore",
    "KVBlockDirectory",
    "KVConnector",
    "KVStore",
    "KVTransferStats",
    "LeasedStore",
    "PeerStore",
    "RayObjectStore",
    "StepCost",
    "StepTimes",
    "TransferCostModel",
    "WriteBehindStore",
    "connector_for",
    "decode_block",
    "encode_block",
    "fit_chunk",
    "flush_writes_to",
    "layout_of",
    "model_changed",
    "model_fingerprint",
    "one_file_bytes",
]


def model_changed(connector: KVConnector | None, *, behaviour: bool) -> None:
    """The engine saw new weights or a change of its modules' behaviour (`behaviour`): `KVConnector.model_changed`
    (nothing without a connector)."""
    if connector is not None:
        connector.model_changed(behaviour=behaviour)


def connector_for(config: PagedConfig, cache: PagedCache, model: torch.nn.Module,
                  store: KVStore | None = None) -> KVConnector | None:
    """The engine's connector: `store` given, blocks are saved as the prefix cache takes them ("store": another
    engine may load them at once) and loaded from it; else `config.kv_offload_dir`, the disk tier (blocks saved when
    evicted, `kv_offload_bytes` at most, read in the background while the request waits, written by a background
    thread); else None. Writes still queued for that directory by another engine of this process are flushed first,
    so the new store lists them."""
    if store is not None:
        if config.kv_offload_dir is not None:
            raise InvalidConfigError("got both a kv_store and PagedConfig.kv_offload_dir: an engine has one store; "
                                     "give one (a DirectoryStore as kv_store shares a directory between engines)")
        missing = [name for name in ("contains", "get", "put", "background_reads") if not hasattr(store, name)]
        if missing:
            raise TypeError(f"kv_store must be a KVStore (InProcessStore, DirectoryStore, RayObjectStore or one with "
                            f"{', '.join(missing)}), got {type(store).__name__}")
        return KVConnector(cache, model, store, save_on="store")
    if config.kv_offload_dir is not None:
        one_file = one_file_bytes(cache, model)
        if config.kv_offload_bytes < one_file:
            raise InvalidConfigError(f"kv_offload_bytes={config.kv_offload_bytes:,} holds no file of this model's "
                                     f"blocks (one is {one_file:,} bytes: keys, values and its header), so nothing "
                                     f"would ever be saved; give at least {one_file:,}, better a few thousand "
                                     "blocks' worth (default 1 GiB)")
        path = expand_path(config.kv_offload_dir)
        flush_writes_to(path)
        disk = DirectoryStore(path, config.kv_offload_bytes)
        return KVConnector(cache, model, disk, save_on="evict")
    return None


def one_file_bytes(cache: PagedCache, model: torch.nn.Module) -> int:
    """Bytes of the largest file one block of this engine makes on disk (header included, its token ids at their
    widest): the smallest `kv_offload_bytes` that keeps anything. Exact for plain K/V; for quantized or merged
    storage the tensor table is approximated (a few bytes short per layer)."""
    dtype, shape, bs = next(model.parameters()).dtype, cache.kv_shape, cache.block_size
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    if cache.compressed or cache.head_merges is not None:
        per_side = cache.bytes_per_block(dtype) // (2 * shape.num_layers)
        tensors = [(f"{i}.{side}.{part}", torch.zeros(per_side if part == "data" else 0, dtype=torch.uint8))
                   for i in range(shape.num_layers) for side in "kv" for part in ("data", "scale")]
    else:
        tensors = [(f"{i}.{side}", torch.zeros(bs, shape.num_kv_heads, shape.head_dim, dtype=dtype))
                   for i in range(shape.num_layers) for side in "kv"]
    layout = layout_of(cache, "0" * 32, dtype)
    digest = prefix_digests([0] * bs, bs, ())[0]
    return len(encode_block(layout, digest, [max(vocab - 1, 0)] * bs, tensors))
