"""`KVConnector`: full KV blocks in and out of one engine, through a `KVStore`, keyed by the prefix cache's digests.

Two halves, as vLLM splits its KV connector (what the scheduler decides apart from what moves the bytes), with the
failure policy decided once, here:

    scheduler half   num_external_blocks(prompt): how many leading full blocks past the locally cached ones the
                     store holds (a digest chain: block i is only useful after blocks 0..i-1)
                     load_step(seq, prompt, token_budget): for a `load_async` connector, starts reading them in
                     the background; once read, writes them a chunk a step within the step's share (paced_load.py)
                     and caches them in the prefix tree; the request stays queued until then (others run meanwhile)
                     load_prefix(seq, prompt): at admission, the loaded blocks are part of the local hit now
    worker half      fetcher.py: blobs read and checked (checksum, layout, digest, token ids), stopping at the first
                     bad one, in the step or in a worker thread; write_blocks: one `PagedCache.load_blocks` a chunk
                     (the swap path, per layer), on the scheduler's thread
                     blocks_stored / blocks_evicted (the tree's `BlockSink`): `save_blocks`, encode, `store.put`

A load that fails (a blob missing, corrupt or made for another layout, a storage error) falls back to recomputing
what was not loaded, and is counted; a bad blob is deleted from the store. A load with no room in the pool waits for
the blocks running requests hold (`paced_load.py`). Without `load_async`
each chunk's blobs are read in its step (an in-process store: memory copies); saves happen when the
tree stores or evicts blocks, before the pool reuses them (synchronous: ~0.5 ms a 257 KiB block to a local disk).

    prompt:   | cached here | in the store          | not anywhere | last token |
               0 .. first    first .. first + n      recomputed     always computed (its logits are needed)
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import asdict

import torch

from hf_paged.cache.digests import prefix_digests
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.tree_nodes import TreeNode
from hf_paged.compat import execution_device
from hf_paged.errors import InvalidConfigError
from hf_paged.kv_transfer.block_format import DecodedBlock
from hf_paged.kv_transfer.codec import check_table, stack_blocks
from hf_paged.kv_transfer.cost_model import StepClock, TransferCostModel
from hf_paged.kv_transfer.fetcher import BlockAsk, BlockFetcher, FetchResult, count_held
from hf_paged.kv_transfer.hot_blocks import HotBlockPublisher, PeerStore
from hf_paged.kv_transfer.layout import BlockLayout, layout_of, model_fingerprint
from hf_paged.kv_transfer.paced_load import LoadStep, PacedLoads
from hf_paged.kv_transfer.request_digests import RequestDigests
from hf_paged.kv_transfer.saver import BlockSaver
from hf_paged.kv_transfer.step_times import ChunkFit, chunk_pairs, fit_chunk
from hf_paged.kv_transfer.stores import KVStore
from hf_paged.kv_transfer.transfer_stats import KVTransferStats
from hf_paged.kv_transfer.write_behind import DEFAULT_QUEUE_BYTES, WriteBehindStore

__all__ = ["SAVE_POLICIES", "KVConnector", "KVTransferStats"]

SAVE_POLICIES = ("evict", "store", "hot", "never")


class KVConnector:
    """Loads a request's leading full blocks from a `KVStore` and saves full blocks to it.

    Args:
        cache: the engine's `PagedCache` (with a prefix cache: loaded blocks become prefix-cache blocks).
        model: the model whose weights the blocks belong to (its fingerprint names them).
        store: where blocks live (`InProcessStore`, `DirectoryStore`).
        save_on: "evict" (blocks leaving the prefix cache: a lower tier such as the disk), "store" (every block the
            prefix cache takes, right after it was computed: another engine can load it at once), "hot" (blocks of a
            local prefix hit, at admission: replicas sharing what they reuse, `hot_blocks.py`; `store` must be a
            `PeerStore`), or "never".
        load_async: read blobs in a background thread while the request waits in the queue (`is_fetching`; other
            requests run meanwhile) instead of inside the step that admits it; None: as the store says
            (`background_reads`: the directory store yes, the in-process store no).
        fingerprint: the model's identity, when the sampled weights fingerprint (`model_fingerprint`) is not enough.
        cost_model: decides whether a load beats recomputing (`cost_model.py`); None: one that learns this engine's
            load bandwidth and prefill speed.
        write_behind: write saved blocks from a background thread through a queue of at most `write_queue_bytes`
            (`write_behind.py`: the step only copies the blocks out; a save finding the queue full is dropped and
            counted); None: for a lower tier ("evict") read in the background (`load_async`: the disk tier), not for
            a handover to another engine ("store": a block is in the store when the step that computed it ends).

    Example:
        >>> store = InProcessStore()                                                        # doctest: +SKIP
        >>> prefill = Engine(model, kv_store=store); decode = Engine(model, kv_store=store)  # doctest: +SKIP
    """

    def __init__(self, cache: PagedCache, model: torch.nn.Module, store: KVStore, *, save_on: str = "evict",
                 load_async: bool | None = None, fingerprint: str | None = None, write_behind: bool | None = None,
                 write_queue_bytes: int = DEFAULT_QUEUE_BYTES, cost_model: TransferCostModel | None = None) -> None:
        radix = cache.manager.prefix_cache
        if radix is None:
            raise InvalidConfigError("a KV connector needs the prefix cache (loaded blocks become prefix-cache "
                                     "blocks): PagedConfig(enable_prefix_caching=True)")
        if save_on not in SAVE_POLICIES:
            raise ValueError(f"save_on must be one of {list(SAVE_POLICIES)}, got {save_on!r}")
        if save_on == "hot" and not isinstance(store, PeerStore):
            raise TypeError(f"save_on='hot' publishes through a PeerStore, got {type(store).__name__}: pass "
                            "PeerStore(store)")
        self.cache, self.kv, self.radix, self.store = cache, cache.manager, radix, store
        self.model, self.save_on, self.block_size = model, save_on, cache.block_size
        self._fixed_fingerprint = fingerprint
        self._salt = ""  # set by `model_changed` when the modules' behaviour changed: keys no other engine shares
        self._layout: BlockLayout | None = None
        self._layout_epoch = -1
        self._namespace = b""
        self.counters = KVTransferStats()
        self.load_async = store.background_reads if load_async is None else load_async
        if write_behind is None:
            write_behind = self.load_async and save_on == "evict"  # a handover ("store") is there when put returns
        writer = WriteBehindStore(store, max_queue_bytes=write_queue_bytes) if write_behind else None
        self.store = writer if writer is not None else store  # reads see blocks still queued for writing
        self.fetcher = BlockFetcher(self.store)
        self.saver = BlockSaver(cache, store, writer, self.layout, self._keys, self.counters)
        self.hot = HotBlockPublisher(store, self.saver, self._keys, self.block_size) if save_on == "hot" else None
        self.digests = RequestDigests(self.block_size)  # waiting requests' digests, hashed once
        self.cost = cost_model if cost_model is not None else TransferCostModel()
        self._clock = StepClock(execution_device(model))  # times steps for the cost model
        self._recompute: set[Hashable] = set()  # sequences to load no (more) blocks for: the cost model chose
        # recomputing, or their paced load ended
        self.paced = PacedLoads(self)  # waiting requests' blocks written a chunk a step (paced_load.py)
        self._last_block_bytes = 0
        if save_on != "never":
            radix.block_sink = self

    # -- identity --------------------------------------------------------------------------------------
    def layout(self) -> BlockLayout:
        """This engine's block layout; the fingerprint (every weight's values) is taken again after the prefix cache
        was reset (new weights, or `Engine.reset_prefix_cache` after an edit the engine cannot see)."""
        dtype = next((layer.storage_dtype for layer in self.cache.block_layers if layer.storage_dtype is not None),
                     None) or next(self.model.parameters()).dtype
        if self._layout is None or self._layout_epoch != self.radix.epoch:
            fingerprint = (self._fixed_fingerprint or model_fingerprint(self.model)) + self._salt
            self._layout, self._layout_epoch = layout_of(self.cache, fingerprint, dtype), self.radix.epoch
            self._namespace = self._layout.namespace()
        elif self._layout.dtype != _name(dtype):  # the first forward stored K/V in another dtype than the weights'
            self._layout = layout_of(self.cache, self._layout.fingerprint, dtype)
            self._namespace = self._layout.namespace()
        return self._layout

    def model_changed(self, *, behaviour: bool) -> None:
        """The engine saw its model change (`Engine._check_weights`; it reset the prefix cache): no block saved
        before is loaded again. New weights change the fingerprint (it reads every value); a change of what the
        modules compute on the same weights (a hook, a PEFT adapter turned off: `behaviour`) does not, so from then
        on the fingerprint carries a salt drawn for this change, which no other engine or later change shares (their
        blocks are never loaded here, nor these there)."""
        if behaviour:
            self._salt = "+" + os.urandom(8).hex()
        self._layout = None

    def _keys(self, digests: Sequence[bytes]) -> list[bytes]:
        self.layout()
        return [self._namespace + d for d in digests]

    # -- scheduler half ----------------------------------------------------------------------------------
    def num_external_blocks(self, token_ids: Sequence[int], extra_keys: tuple = (), num_cached_tokens: int = 0,
                            digests: Sequence[bytes] | None = None) -> int:
        """Leading full blocks of `token_ids` past the first `num_cached_tokens` that the store holds (the last
        token is never counted: its logits are needed). Reads no blob."""
        bs = self.block_size
        first, limit = num_cached_tokens // bs, (len(token_ids) - 1) // bs
        if limit <= first:
            return 0
        digests = digests if digests is not None else prefix_digests(token_ids[: limit * bs], bs, extra_keys)
        if self.hot is not None:  # a miss may ask the directory (a round trip) only for blocks worth it
            self.hot.worth_asking((limit - first) * bs, self.cost)
        n, failed = count_held(self.store, self._keys(digests[first:limit]), self.fetcher.failures)
        self.counters.load_failures += failed  # (a store that raised: a miss, the prefix recomputed)
        return n

    def load_step(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple = (),
                  token_budget: int | None = None) -> LoadStep:
        """Admission's question for a waiting sequence: must it wait for blocks the store holds past its local hit
        (admit others meanwhile)? The first time, starts their background read (`load_async`); once they are read
        (or, reading in the step, at once) writes them into the pool a chunk a step, each step at most its share:
        `token_budget` prompt tokens' worth (`TransferCostModel.block_tokens`; None: all at once). `LoadStep` says
        whether it still waits and how many of the budget's tokens the writes took (`paced_load.py`)."""
        return self.paced.step(seq_id, token_ids, extra_keys, token_budget)

    def is_fetching(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple = ()) -> bool:
        """`load_step` without a bound: whether the sequence still waits for its blocks."""
        return self.load_step(seq_id, token_ids, extra_keys).waiting

    def prefetch(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple = ()) -> bool:
        """A sequence arrived: start reading the blocks the store holds past its local hit now, not when it is
        admitted (a long queue's reads overlap the steps before its turn). Reads waiting to be taken hold at most the
        pool's worth of blocks; past that, the read starts at admission. True when a read started."""
        if seq_id in self.fetcher:
            return False
        room = self.kv.pool.num_blocks - self.fetcher.num_blocks
        started = self.start_read(seq_id, token_ids, extra_keys, room, whole=True)
        self.counters.prefetched_reads += started
        return started

    def start_read(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple, room: int, *,
                    whole: bool = False) -> bool:
        """Start a background read of up to `room` blocks the store holds past the local hit (`whole`: all of them
        or none), when the cost model finds loading them cheaper than recomputing (`load_async` connectors only)."""
        bs = self.block_size
        limit = (len(token_ids) - 1) // bs
        if not self.load_async or limit < 1 or room < 1 or seq_id in self._recompute:
            return False
        digests = self.digests.digests(seq_id, token_ids[: limit * bs], extra_keys)
        first = self.radix.peek(token_ids[: limit * bs], extra_keys, digests) // bs
        held = self.num_external_blocks(token_ids, extra_keys, first * bs, digests)
        wanted = min(held, room)
        if not wanted or (whole and wanted < held) or not self.worth_loading(seq_id, wanted):
            return False
        asks = self.asks(digests, token_ids, first, wanted)
        self.fetcher.submit(seq_id, self.layout(), asks, first=first, epoch=self.radix.epoch)
        return True

    def worth_loading(self, seq_id: Hashable, num_blocks: int) -> bool:
        """The cost model's answer, remembered for the sequence when it is no (asked once, counted once)."""
        if self.cost.should_load(num_blocks * self.block_bytes(), num_blocks * self.block_size):
            return True
        self._recompute.add(seq_id)
        self.counters.loads_skipped += 1
        return False

    def block_bytes(self) -> int:
        """A block's bytes in the store: the last one loaded, else the layout's plain K/V (quantized: fewer)."""
        if not self._last_block_bytes:
            shape, dtype = self.cache.kv_shape, next(self.model.parameters()).dtype
            itemsize = torch.empty((), dtype=dtype).element_size()
            return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * self.block_size * itemsize
        return self._last_block_bytes

    # -- the cost model's prefill clock: a step's scheduling done, then its forward's first stored block ----------
    def step_started(self, out) -> None:
        """The scheduler planned a step (`SchedulerOutput`): time it if it is mostly prompt tokens."""
        for sample in self._clock.samples():
            if self.cost.learn:
                self.cost.observe_step(sample.num_tokens, sample.num_prompt_tokens, sample.seconds, sample.num_pairs)
        if self.hot is not None:
            self.hot.store.new_round()  # the next lookup that misses may ask the directory again
        chunks = [item for item in out.scheduled if item.num_tokens > 1 + item.num_draft_tokens]
        pairs = sum(chunk_pairs(item.num_tokens, item.request.num_computed_tokens) for item in chunks)
        self._clock.start(out.num_batched_tokens, sum(item.num_tokens for item in chunks), pairs)

    def prompt_budget(self, limit: int, ratio: float | None, num_decodes: int | None = None) -> int:
        """Prompt tokens a step with `num_decodes` decodes may take (chunks and block writes): `limit`, and with a
        `ratio` at most what keeps it within `ratio` decode-only steps as this engine measured them (cost model)."""
        return self.cost.prompt_budget(limit, ratio, num_decodes)

    def fit_chunk(self, num_wanted: int, num_context: int, budget: int, limit: int, ratio: float | None) -> ChunkFit:
        """A prompt chunk after `num_context` cached tokens cut to a step's `budget` of prompt tokens: with a
        `ratio`, each query x key pair costs its measured share of a token (`step_times.fit_chunk`: a chunk after a
        long context gets fewer tokens) and a chunk's pairs stay near what the fit has seen; tokens alone without."""
        return fit_chunk(num_wanted, num_context, budget, self.cost.pair_tokens(ratio),
                         self.cost.pair_limit(ratio, limit))

    @property
    def num_fetching(self) -> int:
        """Background reads and paced loads not finished: while there are some, a step with nothing to run is a
        wait."""
        return len(self.fetcher) + len(self.paced)

    def wait(self, timeout: float) -> None:
        """Block until a background read finishes, at most `timeout` seconds."""
        self.fetcher.wait(timeout)

    def forget(self, seq_id: Hashable) -> None:
        """The sequence ended or left the queue: drop its background read."""
        self.fetcher.forget(seq_id)
        self.digests.forget(seq_id)
        self._recompute.discard(seq_id)
        self.paced.forget(seq_id)

    def skips(self, seq_id: Hashable) -> bool:
        """Whether no (more) blocks are to be loaded for the sequence."""
        return seq_id in self._recompute

    def settle(self, seq_id: Hashable, *, failed: bool) -> None:
        """The sequence's paced load ended (`failed`: short of what the store announced, counted): load no more."""
        self._recompute.add(seq_id)
        self.counters.load_failures += failed

    def clock_cancel(self) -> None:
        """Blocks cached outside a forward (a load): the open step is not timed."""
        self._clock.cancel()

    def load_prefix(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple,
                    num_cached_tokens: int) -> int:
        """A newly registered sequence took its local prefix hit (`num_cached_tokens`): the blocks a store held past
        it were loaded while it waited (`load_step`) and are part of that hit now; with `save_on="hot"` the hit's
        blocks the store lacks are published. Returns the tokens computed."""
        self.paced.uncount(seq_id, num_cached_tokens)  # the tokens its load wrote were no local hit
        first = num_cached_tokens // self.block_size
        if self.hot is not None and first and not num_cached_tokens % self.block_size:  # the hit's blocks are hot
            self._publish(seq_id, token_ids, extra_keys, first)
        return num_cached_tokens

    def count_load(self, blocks: Sequence[DecodedBlock], step_seconds: float, seconds: float) -> None:
        """`blocks` were loaded: `step_seconds` on the step's thread, `seconds` in all (a background read too)."""
        nbytes = sum(b.nbytes for b in blocks)
        self.counters.loaded_blocks += len(blocks)
        self.counters.loaded_tokens += len(blocks) * self.block_size
        self.counters.loaded_bytes += nbytes
        self.counters.load_seconds += step_seconds
        if blocks:
            self._last_block_bytes = nbytes // len(blocks)
            if self.cost.learn:  # the read (here or in the worker thread) and the copy into the pool
                self.cost.observe_load(nbytes, seconds)
                self.cost.observe_step_load(nbytes, step_seconds)

    def _publish(self, seq_id: Hashable, token_ids: Sequence[int], extra_keys: tuple, num_blocks: int) -> None:
        try:  # the blocks of a local hit (`save_on="hot"`); a failure costs only the copy, never the step
            digests = self.digests.digests(seq_id, token_ids[: num_blocks * self.block_size], extra_keys)
            self.hot.publish(digests, token_ids, self.kv.block_ids(seq_id)[:num_blocks])  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 -- counted; the request runs on its local hit
            self.counters.save_failures += 1

    # -- worker half: loads ------------------------------------------------------------------------------
    def asks(self, digests: Sequence[bytes], token_ids: Sequence[int], first: int, count: int) -> list[BlockAsk]:
        bs, chosen = self.block_size, digests[first : first + count]
        return [BlockAsk(key, d, token_ids[(first + i) * bs : (first + i + 1) * bs])
                for i, (d, key) in enumerate(zip(chosen, self._keys(chosen)))]

    def checked(self, result: FetchResult) -> list[DecodedBlock]:
        """A read's blocks; its refused blobs counted and deleted (they can never become valid under their keys)."""
        self.counters.fetch_seconds += result.seconds
        for key in result.refused:
            self.counters.reject(1, "a checksum, header or model fingerprint that does not match")
            self.store.delete(key)
        return result.blocks

    def write_blocks(self, block_ids: list[int], blocks: list[DecodedBlock]) -> bool:
        """Write the blocks' tensors into `block_ids` in every layer; False (nothing usable) on a storage error."""
        # Copies queued by this step's allocations (a shared partial block copied on write) read their sources at
        # the forward; one of those sources may be a block just handed to this load: copy before writing over it.
        self.cache.apply_pending_copies()
        try:
            check_table(self.cache, block_ids[0], [b.tensors for b in blocks])
            saved = stack_blocks([b.tensors for b in blocks], self.cache.kv_shape.num_layers, self.cache.compressed)
            self.cache.load_blocks(block_ids, saved)
        except (KeyError, RuntimeError, TypeError, ValueError):  # a table that does not fit this storage
            self.counters.reject(len(blocks), "tensors that do not fit this cache's storage")
            for key in self._keys([b.digest for b in blocks]):
                self.store.delete(key)
            return False
        return True

    # -- worker half: saves (the prefix tree's BlockSink) ---------------------------------------------------
    def step_ended(self, _output: object = None) -> None:
        """The engine's step is over (a step listener): its time is known."""
        self._clock.stop()

    def blocks_stored(self, nodes: Sequence[TreeNode]) -> None:
        if self.save_on == "store":
            self.saver.save_quietly(nodes)

    def blocks_evicted(self, nodes: Sequence[TreeNode]) -> None:
        if self.save_on == "evict":
            self.saver.save_quietly(nodes)

    def save(self, nodes: Sequence[TreeNode]) -> int:
        """Save full cached blocks (tree nodes: digest, block id, token ids) the store does not hold yet; returns
        how many were written (or queued for the writer thread: `flush` waits for them)."""
        return self.saver.save(nodes)

    def save_cached(self) -> int:
        """Write every block the prefix cache holds now that the store lacks (before a shutdown, so a restart finds
        the whole cache, not only what was evicted), queued writes first; returns how many were written, all on
        disk when it returns. Hold the engine's lock when another thread may step it (`with engine.lock:`): a
        block evicted and reused meanwhile would be saved with another block's K/V."""
        self.saver.flush()
        return self.saver.save(self.radix.cached_nodes(), wait=True)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued writes are in the store (at most `timeout` seconds); True when none is left."""
        return self.saver.flush(timeout)

    def close(self, *, flush: bool = True) -> None:
        """Stop the background threads: queued writes are written (`flush`) or dropped, reads in flight are dropped
        (their requests recompute or read again). The connector stays usable: a later read or write starts a thread
        again."""
        self.saver.close(flush=flush)
        self.fetcher.close()

    @property
    def has_threads(self) -> bool:
        """Whether a reader or writer thread of this connector is alive."""
        return self.fetcher.has_thread or (self.saver.writer is not None and self.saver.writer.is_writing)

    # -- stats -------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """The counters as `kv_transfer_<name>` entries of `Engine.stats()`."""
        self.counters.store_bytes = self.store.nbytes
        merged = {**asdict(self.counters), **self.saver.stats(), **self.cost.stats()}
        return {f"kv_transfer_{k}": v for k, v in merged.items()}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
