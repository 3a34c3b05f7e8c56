"""Colocated replicas that share hot prefixes (`hf-paged serve --replicas N --kv-share`, `deploy(kv_share=True)`).

Each replica's engine gets a connector over Ray's object store (`kv_transfer/hot_blocks.py`): the blocks of its local
prefix hits are published (once each, cluster-wide: a block the directory knows is not put again), and a request
whose prompt goes on past its local hit loads the next blocks a peer published, when the cost model finds loading
cheaper than recomputing. A replica that just joined or restarted thus starts from what the others reuse, and a hot
prefix the router spread for load is computed once. The directory's leases (blocks and bytes) bound what the store
holds; `/metrics` counts blocks loaded (`hf_paged:kv_transfer_loaded_blocks`) and the prefill tokens they saved
(`hf_paged:kv_transfer_loaded_tokens`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hf_paged.batching.engine import Engine
    from hf_paged.kv_transfer.ray_store import RayObjectStore

__all__ = ["attach_kv_share"]


def attach_kv_share(engine: Engine, directory: str, *, max_blocks: int | None = None,
                    max_bytes: int = 16 << 30) -> RayObjectStore:
    """Give `engine` the sharing connector over the object store `directory` (inside a Ray cluster). The lease
    bounds apply when this call creates the directory: `max_blocks` (default: the engine's pool, so the store holds
    at most one replica's worth of shared blocks) and `max_bytes`."""
    from hf_paged.kv_transfer.connector import KVConnector
    from hf_paged.kv_transfer.hot_blocks import PeerStore
    from hf_paged.kv_transfer.ray_store import RayObjectStore

    if engine.scheduler.kv_transfer is not None:
        raise ValueError("this engine already has a KV connector (the disk tier or a prefill/decode role): "
                         "kv_share replaces none; build the engine without it")
    if max_blocks is None:
        max_blocks = engine.cache.num_blocks
    store = RayObjectStore(directory, max_blocks=max_blocks, max_bytes=max_bytes)
    store.directory_stats()  # the directory actor is up (its first start imports torch): no lookup waits for it
    with engine.lock:  # the loop thread may be stepping: swap the connector between steps
        engine.scheduler.kv_transfer = KVConnector(engine.cache, engine.model, PeerStore(store), save_on="hot")
    return store
