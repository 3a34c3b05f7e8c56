"""The Ray Serve adapter: `CacheAwareRouter` as a `ray.serve.request_router.RequestRouter` (tested with Ray 2.60).

    caller (gateway replica)                                   engine replicas
    handle.forward.remote(routing=RoutingInfo, ...)            record_routing_stats() -> CacheSummary.to_stats()
      -> choose_replicas: summaries in, policy.route, ranked        (polled by Serve every period)
      -> on_request_routed / on_request_completed: policy bookkeeping

The router runs in the caller's process. A request whose handle call carries no `routing=` keyword (or a replica
that has not reported yet) is still routed, by load. These Ray APIs are marked alpha: keep the pin in pyproject.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from hf_paged.scaleout import registry
from hf_paged.scaleout.policy import CacheAwareRouter, RouterConfig, RouteRequest, RoutingDecision
from hf_paged.scaleout.prompt_key import RoutingInfo
from hf_paged.scaleout.summary import CacheSummary

__all__ = ["HfPagedRequestRouter", "RoutingInfo"]

logger = logging.getLogger("hf_paged.scaleout")

_MAX_DECISIONS = 100_000


class HfPagedRequestRouter(RequestRouter):
    """Ray Serve request router over `CacheAwareRouter`; `request_router_kwargs` are `RouterConfig` fields plus
    `seed`."""

    def initialize_state(self, **kwargs: Any) -> None:
        seed = kwargs.pop("seed", 0)
        self.policy = CacheAwareRouter(RouterConfig(**kwargs), seed=seed)
        self._summaries: dict[ReplicaID, CacheSummary] = {}  # last summary taken from each replica
        self._decisions: dict[str, tuple[RouteRequest, RoutingDecision]] = {}  # internal request id -> choice
        registry.register(self)

    def snapshot(self) -> dict[str, Any]:
        """The router's view, for debugging: known replicas with their load, work share and reports."""
        policy = self.policy
        replicas = {str(rid.unique_id): policy.replica_stats(rid) for rid in policy.replica_ids}
        now = time.time()
        for rid in policy.replica_ids:  # how stale the router's view of each replica is (None: no summary yet)
            summary = self._summaries.get(rid)
            replicas[str(rid.unique_id)]["summary_age_s"] = None if summary is None else round(summary.age(now), 3)
        return {"replicas": replicas, "routed": {reason.value: n for reason, n in policy.num_routed.items()}}

    # -- membership ----------------------------------------------------------------------------------------
    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.policy.sync_replicas(r.replica_id for r in replicas)
        live = {r.replica_id for r in replicas}
        self._summaries = {k: v for k, v in self._summaries.items() if k in live}

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.remove_replica(replica_id)  # forget its cache summary at once
        self._summaries.pop(replica_id, None)

    # -- routing -------------------------------------------------------------------------------------------
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id: r for r in candidate_replicas}
        for replica in candidate_replicas:
            self.policy.add_replica(replica.replica_id)  # no-op when known
            self._take_report(replica)
        request = self._route_request(pending_request)
        decision = self.policy.route(request, candidates=list(by_id))
        if pending_request is not None:
            self._decisions[pending_request.metadata.internal_request_id] = (request, decision)
            if len(self._decisions) > _MAX_DECISIONS:  # requests cancelled before they were sent: drop the oldest
                del self._decisions[next(iter(self._decisions))]
        ranked = [by_id[rid] for rid in decision.replica_ids]
        # The first choice alone, then the runner-up, then everyone else: a busy favourite (max_ongoing_requests)
        # falls back at once instead of making Serve retry the same rank.
        rest = [r for r in candidate_replicas if r not in ranked]
        return [[r] for r in ranked] + ([rest] if rest else [])

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        entry = self._decisions.get(pending_request.metadata.internal_request_id)
        if entry is not None:
            self.policy.on_routed(entry[0], replica_id, entry[1])

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._decisions.pop(internal_request_id, None)
        self.policy.on_finished(internal_request_id)

    # -- helpers -------------------------------------------------------------------------------------------
    def _take_report(self, replica: RunningReplica) -> None:
        """Take a replica's summary if it is new. The sequence number is read first: an unchanged summary (most
        requests see one) is not unpacked at all."""
        stats = replica.routing_stats
        if not stats:
            return  # not reported yet
        seen = self._summaries.get(replica.replica_id)
        if seen is not None and isinstance(stats, dict) and stats.get("seq") == seen.seq:
            return
        try:
            summary = CacheSummary.from_stats(stats)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("ignoring %s's routing stats: %s", replica.replica_id, exc)
            return
        if summary is None:
            return
        if summary.block_size != self.policy.config.block_size:
            logger.warning("%s reports %d-token blocks, the router digests %d-token blocks: its summary is ignored "
                           "(deploy the router with the replicas' block_size)", replica.replica_id,
                           summary.block_size, self.policy.config.block_size)
            return
        self._summaries[replica.replica_id] = summary
        self.policy.report(replica.replica_id, keys=summary.keys(), load_tokens=summary.load_tokens)

    @staticmethod
    def _route_request(pending_request: PendingRequest | None) -> RouteRequest:
        info = pending_request.kwargs.get("routing") if pending_request is not None else None
        rid = pending_request.metadata.internal_request_id if pending_request is not None else None
        if not isinstance(info, RoutingInfo):
            return RouteRequest(rid, (), num_prompt_tokens=0)  # nothing to match: routed by load
        return RouteRequest(rid, info.fingerprints, info.num_prompt_tokens, info.num_output_tokens)
