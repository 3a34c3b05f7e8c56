"""`DecodeGraphs`: decode steps replayed from CUDA graphs, one graph captured per batch-size bucket.

On a GPU a small model's decode step is bound by the host: the lean forward issues ~25 small ops per layer plus
the attention launches, each a few microseconds of Python and driver time against a kernel of about the same. A
CUDA graph records every kernel of one forward once and replays them with one call (vLLM's and SGLang's decode
graphs; `torch.cuda.graphs`). A graph replays on fixed addresses and shapes, so a decode step of `n` requests runs
on static buffers padded to the smallest bucket `B >= n`:

    static buffers (device)        rows 0 .. n-1: the step          rows n .. B-1: padding
    tokens[0] input ids            the requests' last tokens        0
    tokens[1] positions            their positions                  0
    tokens[2] slots                where their K/V go               -1: the store kernel skips it (nothing written)
    context   context lengths      after this step's token          1 (a padded row attends to one key and is dropped)
    tables    block tables         [n, width] of the step           whatever an earlier step left (valid block ids)

Every bucket's graph is captured at the first decode step the graphs serve, largest first (a warm-up forward on a
side stream first, so Triton compiles outside the capture), with every padded slot at -1, and replays from then on;
all buckets share one memory pool. It serves a step only when the step is what it recorded: every scheduled request decodes exactly
one token and samples it (no prefill chunk, no drafts, no scoring rows), the lean forward runs, attention is the
Triton backend over plain blocks (no compressed layer, no observed or hidden positions), the batch fits the largest
bucket and the tables fit the static width. Anything else runs the eager forward, unchanged.

The logits of a replay are the graph's static output: `run` returns a copy of its first `n` rows. A capture that
fails (an op the model runs that graphs cannot record) turns the graphs off for this engine with one warning; the
step runs eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from hf_paged.batching.lean_forward import LeanForward
from hf_paged.cache.attention import attend_packed
from hf_paged.cache.attention_backends import TritonBackend
from hf_paged.cache.block_layer import BlockLayer
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.paged_layer import PagedLayer

__all__ = ["BUCKETS", "DecodeGraphs", "buckets_up_to"]

# batch sizes a graph is captured for (vLLM's list, cut at max_num_seqs): small steps get a close fit, large
# ones pay at most 1/8 padding
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def buckets_up_to(max_batch: int) -> tuple[int, ...]:
    """The buckets below `max_batch`, then `max_batch` itself (so every batch the scheduler forms has one)."""
    return (*(b for b in BUCKETS if b < max_batch), max_batch)


class DecodeGraphs:
    """Decode steps of one engine replayed from CUDA graphs (module docstring). `capture=False` runs the same
    padded forward on the same static buffers without recording it: the tests' way to check the padding, the
    static metadata and the bucket choice on a machine without a GPU."""

    def __init__(self, lean: LeanForward, layers: Sequence[BlockLayer], *, device: torch.device, block_size: int,
                 max_batch: int, max_blocks_per_seq: int, attention_backend: str, capture: bool = True) -> None:
        self.lean = lean
        self.layers = layers
        self.block_size = block_size
        self.buckets = buckets_up_to(max_batch)
        self.width = max_blocks_per_seq
        self.attention_backend = attention_backend
        self.capture = capture
        self.replays = 0  # steps served by a graph (the engine's stats)
        self.disabled: str | None = None  # why the graphs are off for good (a failed capture)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, PagedMetadata, torch.Tensor | None]] = {}
        self._pool = None
        with torch.inference_mode():
            self._tokens = torch.zeros(3, max_batch, dtype=torch.long, device=device)
            self._context = torch.ones(max_batch, dtype=torch.int32, device=device)
            self._tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=device)
            self._starts = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
            self._keep = torch.arange(max_batch, dtype=torch.long, device=device)

    @property
    def num_captured(self) -> int:
        return sum(graph is not None for graph, _, _ in self._graphs.values())

    def serves(self, num_tokens: int, metadata: PagedMetadata, logits_rows: Sequence[int]) -> bool:
        """Whether this step is one the graphs replay (module docstring); host values only, no device sync."""
        n = metadata.num_seqs
        return (self.disabled is None and num_tokens == n <= self.buckets[-1] and len(logits_rows) == n
                and list(logits_rows) == list(range(n))  # row i is request i (a scored row elsewhere is not)
                and not metadata.observed and not metadata.hidden
                and metadata.block_tables.shape[1] <= self.width
                and all(type(layer) is PagedLayer and layer.key_cache is not None for layer in self.layers))

    @torch.inference_mode()
    def run(self, input_ids: list[int], positions: list[int], metadata: PagedMetadata) -> torch.Tensor | None:
        """The step's fp32 logits `[n, vocab]` from its bucket's graph; None when the capture failed
        (the caller runs the eager forward)."""
        n = len(input_ids)
        bucket = next(b for b in self.buckets if b >= n)
        if bucket not in self._graphs and not self._record_all():
            return None
        graph, static_metadata, out = self._graphs[bucket]
        pad = bucket - n
        host = torch.tensor([input_ids + [0] * pad, positions + [0] * pad,
                             metadata.slot_mapping.tolist() + [-1] * pad], dtype=torch.long)
        self._tokens[:, :bucket].copy_(host)
        self._context[:bucket].copy_(torch.tensor(metadata.context_lens + [1] * pad, dtype=torch.int32))
        tables = metadata.block_tables
        self._tables[:n, : tables.shape[1]].copy_(tables)
        if graph is None:  # capture=False: the same forward, not recorded
            out = self._forward(bucket, static_metadata)
        else:
            graph.replay()
        self.replays += 1
        return out[:n].to(torch.float32, copy=True)  # the static output is overwritten by the next replay

    def _forward(self, bucket: int, metadata: PagedMetadata) -> torch.Tensor:
        metadata.stored.clear()  # one forward of the static metadata, run again each step (and thrice at capture)
        backend = TritonBackend(metadata, self.layers)

        def attend(attn, q, k, v, scaling, window):
            return attend_packed(backend, attn, q, k, v, scaling=scaling, sliding_window=window)

        ids, positions = self._tokens[0, :bucket], self._tokens[1, :bucket]
        return self.lean(ids[None], positions[None], self._keep[:bucket], attend)

    def _static_metadata(self, bucket: int) -> PagedMetadata:
        """A step's metadata whose device tensors are the static buffers (what the backend and the layers read);
        its host lists say "bucket sequences, one query token each" (what the backend decides on)."""
        metadata = PagedMetadata(
            slot_mapping=torch.zeros(bucket, dtype=torch.long),
            block_tables=torch.zeros(bucket, self.width, dtype=torch.int32),
            query_start_loc=list(range(bucket + 1)),
            context_lens=[self.width * self.block_size] * bucket,
            block_size=self.block_size,
            attention_backend=self.attention_backend,
        )
        device = self._tokens.device
        metadata._on_device.update({
            ("slot_mapping", device): self._tokens[2, :bucket],
            ("block_tables", device): self._tables[:bucket],
            ("context_lens", device): self._context[:bucket],
            ("query_start_loc", device): self._starts[: bucket + 1],
        })
        return metadata

    def _record_all(self) -> bool:
        """Capture every bucket's graph, largest first, at the first decode step served (vLLM captures at start):
        one pause then, none later, where a bucket first met mid-traffic would cost that request its capture and
        the Triton compile of its launch (an H200 run lost 1.7 s of a 4 s benchmark to that)."""
        return all(b in self._graphs or self._record(b) for b in reversed(self.buckets))

    def _record(self, bucket: int) -> bool:
        """Capture the graph of `bucket` (or, with capture=False, only its static metadata)."""
        metadata = self._static_metadata(bucket)
        if not self.capture:
            self._graphs[bucket] = (None, metadata, None)
            return True
        self._tokens[2, :bucket].fill_(-1)  # warm-up and capture write no K/V
        self._context[:bucket].fill_(1)
        try:
            with torch.cuda.device(self._tokens.device):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # compiles the Triton specialisations and lets cuBLAS pick its kernels
                        self._forward(bucket, metadata)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: another thread's CUDA work meanwhile (a server's) does not break this capture
                with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                    out = self._forward(bucket, metadata)
        except Exception as exc:  # noqa: BLE001 - any failure: this engine decodes eagerly from now on
            self.disabled = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"hf_paged: capturing a CUDA graph of the decode step failed ({self.disabled}); decode "
                          "steps run eagerly (PagedConfig(cuda_graphs=False) silences this)", RuntimeWarning,
                          stacklevel=2)
            return False
        self._pool = graph.pool()
        self._graphs[bucket] = (graph, metadata, out)
        return True
