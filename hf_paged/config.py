"""`PagedConfig`: every knob of the paged engine, validated at construction. Imports nothing of ours: every layer
may read it."""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from hf_paged.config_checks import (
    check_choice,
    check_head_merge,
    check_int,
    check_sparse_prefill,
    check_streaming_heads,
    is_head_table,
)
from hf_paged.errors import InvalidConfigError

KV_CACHE_DTYPES = ("auto", "fp8", "int8", "int4")
KV_PRUNING_POLICIES = (None, "streaming", "snapkv", "pyramidkv")
PREEMPTION_MODES = ("recompute", "swap")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
PREFIX_EVICTION_POLICIES = ("lru", "lfu", "cost", "slru")
VALUE_QUANT_GROUPS = ("token", "head")
KV_SCALE_FORMATS = ("fp16", "log8")
SCHEDULING_POLICIES = ("budget", "remaining")
SPARSE_PREFILL_PATTERNS = (None, "vertical_slash", "block", "auto")


def _is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


@dataclass(slots=True)
class PagedConfig:
    """Settings of the paged KV cache and the continuous-batching engine.

    Pool size: `num_blocks` if given; else what `max_cache_bytes` buys, taken as asked; else the default budget,
    `memory_fraction` of the memory free when the cache is built (after the weights), capped at what `max_num_seqs`
    sequences of the model's maximum positions could ever use: the embedded 2.3M-parameter model (2048 positions,
    2 KiB of fp32 K/V a token) gets at most 128 x 2048 x 2 KiB = 512 MiB, whatever the machine has free. A pool
    larger than the device's whole memory raises `hf_paged.errors.InvalidConfigError` before anything is allocated.

    Example:
        >>> cfg = PagedConfig(block_size=16, max_num_batched_tokens=256)
        >>> cfg.block_size
        16
    """

    # -- the block pool ------------------------------------------------------------------------------
    # token slots per block; a power of two (1, 2, 4, ... 256), or "auto": picked from the model's shape and the
    # machine when the cache is built (`cache/block_size.py`; measured in benchmarks/block_size_results.md), shown
    # as `block_size` in `Engine.stats()` and the engine's config
    block_size: int | str = 16
    num_blocks: int | None = None  # blocks in the pool; None: sized from max_cache_bytes
    # CPU pools on 2 MiB-aligned memory with transparent huge pages requested (madvise; `cache/huge_pages.py`) where
    # the OS allows, plain memory elsewhere. Off: on this project's CPU box the engine's steady state ran 0.90x the
    # CPU time (5 of 5 pairs faster) but the first touch of a fresh pool, 4x faster when free huge pages exist,
    # stalled up to 6x longer when the kernel had to compact memory (mean 1.41x; benchmarks/block_size_results.md)
    kv_huge_pages: bool = False
    max_cache_bytes: int | None = None  # KV memory budget when num_blocks is None; None: see memory_fraction
    # with neither num_blocks nor max_cache_bytes: the pool's budget is this share of the memory free when the
    # cache is built (after the weights; RAM on CPU, the CUDA driver's free bytes on a GPU; vLLM's
    # gpu_memory_utilization), capped by what max_num_seqs sequences of the model's positions could ever use
    memory_fraction: float = 0.4
    # -- the scheduler ---------------------------------------------------------------------------------
    max_num_seqs: int = 128  # most requests in one forward
    max_num_batched_tokens: int = 1024  # token budget of one forward (decodes + prefill chunks)
    enable_chunked_prefill: bool = True  # split prompts longer than the remaining budget across steps
    # most prompt tokens one step may carry while requests are decoding (Sarathi-Serve's bounded chunk): a long
    # prompt is spread over several steps instead of stalling every decode for one long step. None: no bound
    # beyond max_num_batched_tokens. A latency/throughput trade: on a 60M model on CPU, 64 cuts the p99 inter-token
    # gap from 6.1x to 1.8x its p50 at the same throughput (`benchmarks/latency.py --arrivals`), while on the
    # 2.3M embedded model it costs the demo's batch a quarter of its speed. Applies with chunked prefill only; an
    # engine with nothing decoding prefills at full budget
    max_prefill_tokens_per_step: int | None = None
    # with max_prefill_tokens_per_step, also size a step's prompt tokens (chunks and KV-load writes) by time: at
    # most what keeps a step that carries decodes within this many of the engine's own measured decode-only steps
    # (kv_transfer/cost_model.py `StepTimes`; the engine's KV connector times its steps: needs kv_store= or
    # kv_offload_dir). Relative, so one value holds across models and machines; None: the token bound alone
    max_prefill_step_time_ratio: float | None = None
    preemption_mode: str = "recompute"  # "recompute" | "swap" (blocks copied to CPU and back)
    # "budget": admit whatever the token budget and the free blocks allow now | "remaining": keep back the blocks the
    # running requests need to their last token, decode shortest remaining tail first, preempt the longest tail
    # (`batching/decode_lengths.py`; measured in benchmarks/decode_lengths_results.md)
    scheduling_policy: str = "budget"
    # -- prefix sharing ------------------------------------------------------------------------------
    enable_prefix_caching: bool = True
    # "lru" | "lfu" | "cost" (recompute cost x decayed reuse, remembered after eviction) | "slru" (LRU, reused
    # prefixes and what extends them protected for two pool turnovers); cache/eviction_policy.py
    prefix_eviction_policy: str = "lru"
    # most of the pool that pinned prefixes (`Engine.pin_prefix`) may hold, as a share of its blocks, in [0, 1)
    prefix_pin_share: float = 0.5
    cache_salt: str | None = None  # extra key of every block digest (separates tenants / adapters)
    # the disk tier (`hf_paged/kv_transfer/`): full blocks evicted from the prefix cache are written to this
    # directory (one file per block, checksummed, keyed by model fingerprint and block digest) and read back on a
    # later prefix hit instead of being recomputed; survives a restart of the same model. One engine process per
    # directory (a lock file: another process gets KVDirectoryInUseError); `~`, `$VARS` expanded. None: no disk tier
    kv_offload_dir: str | None = None
    kv_offload_bytes: int = 2**30  # most bytes of its files (LRU out); >= one file of the model's; with the dir only
    # -- KV compression --------------------------------------------------------------------------------
    kv_cache_dtype: str = "auto"  # "auto" | "fp8" | "int8" | "int4"; sets keys and values alike
    key_cache_dtype: str | None = None  # overrides kv_cache_dtype for keys (e.g. "int8" with values "int4")
    value_cache_dtype: str | None = None  # overrides kv_cache_dtype for values
    # quantized values' scale groups: "token" (one scale per token over all its KV heads; int4 30.9% of bf16 with
    # int4 keys) | "head" (one per token and KV head: int4 32.0%, half the value error; cache/compression/formats.py)
    value_quant_group: str = "token"
    # how quantized blocks store their scales: "fp16" | "log8" (one byte, 2^(k/10) rounded up: 7.2% steps, scales
    # 2^-16 .. 2^9.5; int4 keys 0.625 instead of 0.688 bytes per element, see cache/compression/formats.py)
    kv_scale_format: str = "fp16"
    # int4 keys: quantize each block in the RoPE rotation of its first slot (undo each token's rotation by its
    # offset in the block, redo it on read; see cache/key_frame.py). Same bytes, about half the int4 key error on
    # the default model; torch read path only (the fused kernels do not rotate)
    kv_key_derotate: bool = False
    # token pruning: drop a request's least useful KV blocks (None | "streaming" | "snapkv" | "pyramidkv");
    # not the prefix cache's eviction (`prefix_eviction_policy`)
    kv_pruning: str | None = None
    kv_keep_ratio: float = 1.0  # share of a request's prompt blocks kept by pruning (0 < r <= 1)
    num_sink_tokens: int = 16  # attention sinks kept by "streaming"
    window_tokens: int = 256  # recent window kept by eviction policies
    kv_budget_tokens: int | None = None  # most tokens a request keeps after eviction; None: only kv_keep_ratio
    # per layer, the KV heads kept in the model dtype while the others use key/value_cache_dtype (head-aware
    # precision: e.g. `calibrate_retrieval_heads(...).full_precision_heads`); None: every head alike
    kv_full_precision_heads: tuple[tuple[int, ...], ...] | None = None
    # per layer, the KV heads that keep only the first `num_sink_tokens` and the last `window_tokens` (at block
    # granularity) in a smaller store of their own (DuoAttention's streaming heads, e.g.
    # `calibrate_streaming_heads(...).streaming_heads`); None: every head keeps its whole history
    kv_streaming_heads: tuple[tuple[int, ...], ...] | None = None
    # per layer, per query head, the query head whose attention probabilities it uses (CHAI's clustered heads,
    # e.g. `calibrate_head_merge(...).representatives`; cache/head_merge.py): keys are stored only for the KV heads
    # of representatives, values for every KV head. None: every head attends on its own
    head_merge: tuple[tuple[int, ...], ...] | None = None
    # -- kernels ---------------------------------------------------------------------------------------
    # "auto": Triton on CUDA, the numba kernels on the CPU in fp32 (both read the blocks in place), the torch
    # reference otherwise | "torch": the reference (gathers each step's blocks, then SDPA) | "triton"
    attention_backend: str = "auto"
    # decode steps replayed from CUDA graphs captured per batch-size bucket (`batching/decode_graphs.py`): None
    # (auto) and True use them on CUDA where they apply (the lean forward, plain blocks, Triton attention, every
    # scheduled request decoding one token); False always runs the eager forward. No effect off CUDA
    cuda_graphs: bool | None = None
    # greedy rows' tokens from a bf16 copy of the lm_head with a proof that each is the fp32 head's argmax
    # (`batching/certified_head.py`; the same tokens, the exact values computed only where the proof leaves a row
    # open; the copy costs half the head's fp32 bytes): None (auto) on CPUs with native bf16 products for heads of
    # >= 2M weights and >= 128 wide, when every row of a step is plain greedy; True wherever the head is fp32 on the
    # CPU; False never
    certified_argmax: bool | None = None
    # block-sparse attention of long prompts' prefill chunks (cache/sparse_prefill.py; an approximation, off by
    # default): None (dense) | "vertical_slash" | "block" (MInference's patterns) | "auto" (per head, the one that keeps
    # more of a sample's attention). Each 64-query block keeps the sink, its local blocks and the best-estimated others
    sparse_prefill: str | None = None
    sparse_prefill_min_tokens: int = 8192  # context length from which a prefill chunk is attended sparsely
    sparse_keep_ratio: float = 0.2  # share of each query block's visible key blocks it keeps (0 < r <= 1)
    kv_eviction: str | None = None  # deprecated name of kv_pruning (warns; moved there at construction)

    def __post_init__(self) -> None:
        if isinstance(self.block_size, str) and self.block_size != "auto":
            raise TypeError(f"PagedConfig.block_size must be an int (a power of two from 1 to 256) or \"auto\", got "
                            f"str ({self.block_size!r}); use e.g. 16 or \"auto\"")
        if self.block_size != "auto":
            check_int("block_size", self.block_size, minimum=1)
            if not _is_power_of_two(self.block_size) or self.block_size > 256:
                raise ValueError(
                    f"PagedConfig.block_size must be a power of two between 1 and 256 (or \"auto\"), got "
                    f"{self.block_size}; use e.g. 16"
                )
        if self.num_blocks is not None:
            check_int("num_blocks", self.num_blocks, minimum=1)
        for f in fields(self):  # every switch (a string such as "no" read as true before): ValueError and TypeError
            value = getattr(self, f.name)
            if f.type in ("bool", "bool | None") and not isinstance(value, bool) and not (
                    value is None and f.type == "bool | None"):
                allowed = "None (auto), True or False" if "None" in f.type else "True or False"
                raise InvalidConfigError(f"PagedConfig.{f.name} must be {allowed}, got {value!r}")
        if self.max_cache_bytes is not None:
            check_int("max_cache_bytes", self.max_cache_bytes, minimum=1)
        if isinstance(self.memory_fraction, bool) or not isinstance(self.memory_fraction, (int, float)) \
                or not 0 < self.memory_fraction <= 1:
            raise ValueError(f"PagedConfig.memory_fraction must be in (0, 1], got {self.memory_fraction!r}")
        check_int("max_num_seqs", self.max_num_seqs, minimum=1)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, minimum=1)
        if self.max_prefill_tokens_per_step is not None:
            check_int("max_prefill_tokens_per_step", self.max_prefill_tokens_per_step, minimum=1)
        ratio = self.max_prefill_step_time_ratio
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 1):
            raise ValueError(f"PagedConfig.max_prefill_step_time_ratio must be a number > 1 (a step's time over a "
                             f"decode-only step's) or None, got {ratio!r}")
        if ratio is not None and self.max_prefill_tokens_per_step is None:
            raise ValueError("PagedConfig.max_prefill_step_time_ratio bounds prompt tokens below "
                             "max_prefill_tokens_per_step (the bound until step times are measured): set both")
        check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        check_choice("prefix_eviction_policy", self.prefix_eviction_policy, PREFIX_EVICTION_POLICIES)
        if isinstance(self.prefix_pin_share, bool) or not isinstance(self.prefix_pin_share, (int, float)) \
                or not 0 <= self.prefix_pin_share < 1:  # (pins never free themselves: they must not fill the pool)
            raise ValueError(f"PagedConfig.prefix_pin_share must be in [0, 1) (the share of the pool's blocks pinned "
                             f"prefixes may hold; at 1 they could fill it), got {self.prefix_pin_share!r}")
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        for name in ("key_cache_dtype", "value_cache_dtype"):
            value = getattr(self, name)
            if value is not None:
                check_choice(name, value, KV_CACHE_DTYPES)
        check_choice("value_quant_group", self.value_quant_group, VALUE_QUANT_GROUPS)
        check_choice("kv_scale_format", self.kv_scale_format, KV_SCALE_FORMATS)
        if self.kv_key_derotate and (self.key_cache_dtype or self.kv_cache_dtype) != "int4":
            raise ValueError(
                f"PagedConfig.kv_key_derotate=True acts on int4 keys (quantized per channel) but the keys are "
                f"{self.key_cache_dtype or self.kv_cache_dtype!r}; allowed: kv_key_derotate=False, or True with "
                "kv_cache_dtype / key_cache_dtype 'int4'"
            )
        if self.kv_eviction is not None:
            warnings.warn("PagedConfig.kv_eviction is now kv_pruning (token pruning, not the prefix cache's "
                          "eviction); pass kv_pruning=", DeprecationWarning, stacklevel=3)
            if self.kv_pruning is not None and self.kv_pruning != self.kv_eviction:
                raise ValueError(f"PagedConfig got kv_pruning={self.kv_pruning!r} and its old name kv_eviction="
                                 f"{self.kv_eviction!r}; pass kv_pruning only")
            self.kv_pruning, self.kv_eviction = self.kv_eviction, None
        check_choice("kv_pruning", self.kv_pruning, KV_PRUNING_POLICIES)
        if isinstance(self.kv_keep_ratio, bool) or not isinstance(self.kv_keep_ratio, (int, float)) \
                or not 0 < self.kv_keep_ratio <= 1:
            raise ValueError(f"PagedConfig.kv_keep_ratio must be in (0, 1], got {self.kv_keep_ratio!r}")
        check_int("num_sink_tokens", self.num_sink_tokens, minimum=0)
        check_int("window_tokens", self.window_tokens, minimum=1)
        if self.kv_budget_tokens is not None:
            check_int("kv_budget_tokens", self.kv_budget_tokens, minimum=1)
            floor = self.num_sink_tokens + self.window_tokens
            if self.kv_budget_tokens < floor:
                raise ValueError(
                    f"PagedConfig.kv_budget_tokens={self.kv_budget_tokens} is smaller than num_sink_tokens + "
                    f"window_tokens = {floor}; allowed: None or an int >= {floor}"
                )
        check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        check_choice("sparse_prefill", self.sparse_prefill, SPARSE_PREFILL_PATTERNS)
        check_int("sparse_prefill_min_tokens", self.sparse_prefill_min_tokens, minimum=1)
        if isinstance(self.sparse_keep_ratio, bool) or not isinstance(self.sparse_keep_ratio, (int, float)):
            raise TypeError(f"PagedConfig.sparse_keep_ratio must be a float in (0, 1], got "
                            f"{type(self.sparse_keep_ratio).__name__} ({self.sparse_keep_ratio!r})")
        if not 0 < self.sparse_keep_ratio <= 1:  # (NaN fails too)
            raise ValueError(f"PagedConfig.sparse_keep_ratio must be in (0, 1] (the share of key blocks each query "
                             f"block keeps; 1 = dense), got {self.sparse_keep_ratio!r}")
        if self.kv_full_precision_heads is not None:
            heads = self.kv_full_precision_heads
            if not is_head_table(heads):
                raise ValueError(
                    "PagedConfig.kv_full_precision_heads must be None or one tuple of KV head indices (ints >= 0) per "
                    f"layer, e.g. ((0,), (), (1,)); got {heads!r}"
                )
            # (de-duplicated and sorted, as kv_streaming_heads: equal settings must name one KV layout)
            self.kv_full_precision_heads = tuple(tuple(sorted(set(layer))) for layer in heads)
        if self.kv_streaming_heads is not None:
            self.kv_streaming_heads = check_streaming_heads(self)
        self._check_offload()
        if self.head_merge is not None:
            self.head_merge = check_head_merge(self)
        check_sparse_prefill(self)
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise TypeError(f"PagedConfig.cache_salt must be a str or None, got {type(self.cache_salt).__name__}")
        if self.cache_salt == "":  # (it keyed blocks exactly as no salt: a tenant's "" shared everyone's blocks)
            raise ValueError("PagedConfig.cache_salt is empty, which separates nothing: give a non-empty str, or None")
        self._check_inert()

    def _check_inert(self) -> None:
        """A field set away from its default where nothing reads it is a mistake (it ran as if unset)."""
        quantized, pruning = self.key_dtype != "auto" or self.value_dtype != "auto", self.kv_pruning is not None
        windowed = pruning or self.kv_streaming_heads is not None  # sinks and a local window: pruning, streaming heads
        for name, changed, used, needs in (
            ("kv_keep_ratio", self.kv_keep_ratio != 1.0, pruning, "kv_pruning"),
            ("kv_budget_tokens", self.kv_budget_tokens is not None, pruning, "kv_pruning"),
            ("kv_pruning", self.kv_pruning in ("snapkv", "pyramidkv"),
             self.kv_keep_ratio < 1 or self.kv_budget_tokens is not None,
             "kv_keep_ratio < 1 or kv_budget_tokens (SnapKV / PyramidKV keep that much of a prompt; by default, all)"),
            ("num_sink_tokens", self.num_sink_tokens != 16, windowed, "kv_pruning or kv_streaming_heads"),
            ("window_tokens", self.window_tokens != 256, windowed, "kv_pruning or kv_streaming_heads"),
            ("prefix_eviction_policy", self.prefix_eviction_policy != "lru", self.enable_prefix_caching,
             "enable_prefix_caching=True"),
            ("max_prefill_tokens_per_step", self.max_prefill_tokens_per_step is not None,
             self.enable_chunked_prefill, "enable_chunked_prefill=True"),
            ("kv_full_precision_heads", self.kv_full_precision_heads is not None, quantized,
             "a kv_cache_dtype (whose key_cache_dtype / value_cache_dtype are not both 'auto')"),
            ("sparse_prefill_min_tokens", self.sparse_prefill_min_tokens != 8192, self.sparse_prefill is not None,
             "sparse_prefill"),
            ("sparse_keep_ratio", self.sparse_keep_ratio != 0.2, self.sparse_prefill is not None, "sparse_prefill"),
            ("value_quant_group", self.value_quant_group != "token", self.value_dtype != "auto",
             "a value_cache_dtype (or kv_cache_dtype)"),
            ("kv_scale_format", self.kv_scale_format != "fp16", quantized, "a kv_cache_dtype"),
            ("kv_offload_bytes", self.kv_offload_bytes != 2**30, self.kv_offload_dir is not None, "kv_offload_dir"),
        ):
            if changed and not used:
                raise InvalidConfigError(f"PagedConfig.{name}={getattr(self, name)!r} does nothing here: it acts "
                                         f"only with {needs}; set that too, or leave {name} at its default")

    def _check_offload(self) -> None:
        if self.kv_offload_dir is not None:
            if isinstance(self.kv_offload_dir, os.PathLike):
                self.kv_offload_dir = os.fspath(self.kv_offload_dir)
            if not isinstance(self.kv_offload_dir, str) or not self.kv_offload_dir:
                raise ValueError(f"PagedConfig.kv_offload_dir must be None or a directory path (str or os.PathLike), "
                                 f"got {self.kv_offload_dir!r}")
            if not self.enable_prefix_caching:
                raise ValueError("PagedConfig.kv_offload_dir needs enable_prefix_caching=True (the disk tier holds "
                                 "blocks evicted from the prefix cache); allowed: kv_offload_dir=None, or "
                                 "enable_prefix_caching=True")
        if isinstance(self.kv_offload_bytes, bool) or not isinstance(self.kv_offload_bytes, int) \
                or self.kv_offload_bytes < 1:
            raise ValueError(f"PagedConfig.kv_offload_bytes must be an int >= 1 (bytes of the disk tier), got "
                             f"{self.kv_offload_bytes!r}")

    @property
    def block_extra_keys(self) -> tuple:
        """What every block digest includes besides its tokens (the cache salt, when set). Engines, the gateway
        and replica reports must digest alike, or no prefix ever matches: they all read it here."""
        return (self.cache_salt,) if self.cache_salt else ()

    @property
    def key_dtype(self) -> str:
        """Storage format of keys ("auto", "fp8", "int8" or "int4")."""
        return self.key_cache_dtype or self.kv_cache_dtype

    @property
    def value_dtype(self) -> str:
        """Storage format of values ("auto", "fp8", "int8" or "int4")."""
        return self.value_cache_dtype or self.kv_cache_dtype

    def with_overrides(self, **overrides: Any) -> PagedConfig:
        """A copy with some fields changed; unknown names raise `TypeError` listing the valid ones."""
        message = unknown_fields_message(overrides)
        if message:
            raise TypeError(message)
        return replace(self, **overrides)


def unknown_fields_message(names: Iterable[str]) -> str | None:
    """The error text for names that are no `PagedConfig` field (a close field suggested for each), else None."""
    valid = sorted(f.name for f in fields(PagedConfig))
    unknown = sorted(set(names) - set(valid))
    if not unknown:
        return None
    hints = [f"{name!r} -> {close[0]!r}" for name in unknown if (close := difflib.get_close_matches(name, valid, 1))]
    did_you_mean = f" (did you mean {', '.join(hints)}?)" if hints else ""
    return f"unknown PagedConfig field(s) {unknown}{did_you_mean}; valid fields: {valid}"
