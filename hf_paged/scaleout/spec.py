"""`ReplicaSpec`: what every engine replica loads and how it runs (plain data, pickled to each replica); the
gateway reads its block size and digest keys from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_paged.serving.app import ServerSettings
    from hf_paged.serving.auth import KeyCheck

__all__ = ["ReplicaSpec"]


@dataclass(slots=True)
class ReplicaSpec:
    """What every engine replica loads and how it runs (plain data: it is pickled to each replica)."""

    model: str | None = None  # a local model directory or hub id; None: the embedded tiny model
    served_model_name: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    paged: dict[str, Any] = field(default_factory=dict)  # PagedConfig fields (block_size, num_blocks, ...)
    max_waiting: int | None = None
    chat_template: str | None = None  # a Jinja template (the text) replacing the tokenizer's
    summary_limit: int | None = None  # most fingerprints per routing summary (None: the whole pool, never cut)
    routing_events: bool = False  # report block events between summaries (routing_stats.py); off: a summary a poll
    summary_every: int = 10  # with routing_events: stats polls per full summary (poll often: `stats_period_s`)
    torch_threads: int | None = None  # torch.set_num_threads in each replica (None: leave it)
    kv_role: str | None = None  # "prefill" / "decode": prefill/decode disaggregation (kv_roles.py); None: colocated
    kv_directory: str = "hf_paged_kv_directory"  # the Ray object store's block directory (a named actor)
    kv_share: bool = False  # colocated replicas publish their prefix hits' blocks and load each other's (kv_share.py)
    kv_share_max_blocks: int | None = None  # the shared directory's lease in blocks (None: one replica's pool)
    generation_config: str = "auto"  # `hf-paged serve --generation-config`: omitted sampling fields' defaults
    max_cache_retention_s: float = 3600.0  # `--max-cache-retention`: the longest cache_retention_seconds (0: refused)
    max_stop_sequences: int | None = None  # `--max-stop-sequences` (None: the server's default; 0: no bound)
    api_key: KeyCheck | None = None  # `--api-key`, as its digest (the key itself never enters the cluster's state):
    # the gateway answers 401 to a request without it, before routing or tokenizing anything
    prefill_timeout_s: float = 60.0  # a fault bound: a prefill not back by then (no prefill replica alive: Serve
    # queues the call until a replacement starts) is given up and the decode replica recomputes the prompt

    def server_settings(self) -> ServerSettings:
        """The single server's settings each replica's app runs with (no api_key: the gateway checks it; a replica
        is reached through Ray handles only)."""
        from hf_paged.serving.app import ServerSettings

        settings = ServerSettings(model_name=self.name, max_waiting=self.max_waiting,
                                  generation_config=self.generation_config,
                                  max_cache_retention_s=self.max_cache_retention_s)
        if self.max_stop_sequences is not None:
            settings.max_stop_sequences = self.max_stop_sequences
        return settings

    @property
    def model_path(self) -> str:
        from hf_paged.api.models import DEFAULT_MODEL_PATH

        return self.model or str(DEFAULT_MODEL_PATH)

    @property
    def name(self) -> str:
        return self.served_model_name or (self.model or "hf-paged/tiny-lm")

    @property
    def block_size(self) -> int:
        from hf_paged.config import PagedConfig

        return PagedConfig(**self.paged).block_size

    @property
    def extra_keys(self) -> tuple:
        from hf_paged.config import PagedConfig

        return PagedConfig(**self.paged).block_extra_keys
