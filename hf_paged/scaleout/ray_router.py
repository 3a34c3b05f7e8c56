"""The Ray Serve adapter: `CacheAwareRouter` as a `ray.serve.request_router.RequestRouter` (tested with Ray 2.60).

    caller (gateway replica)                                   engine replicas
    handle.forward.remote(routing=RoutingInfo, ...)            record_routing_stats() -> RoutingStats.poll():
      -> choose_replicas: reports in, policy.route, policy.book      a CacheSummary + the block events after it
      -> on_request_routed: policy.on_routed (confirm, or move)        (polled by Serve every period)
      -> on_request_completed: policy.on_finished (or unbook)

The first choice is booked when it is made, so the choices Serve makes while a replica has not accepted a request yet
(a round trip, longer to a replica busy prefilling) see it. Serve 2.60 calls `on_request_routed` once the replica
accepted the request (the rejection protocol, on outside Ray Client), with the replica it went to: a later rank when
the first was full, and the booking moves there. A rejected attempt, or one that failed before the replica accepted
it, ends with `on_request_completed` and no `on_request_routed`: the booking is undone (Serve then asks
`choose_replicas` again). A request cancelled while it waited for a replica gets no call at all: its booking is
undone at the next choice, seen by its cancelled future.

A report is taken when it is new: a new summary resets the replica's view (and the event cursor to the summary's
`event_seq`); events numbered after the cursor are applied in order on top. A report whose events start past the
cursor (a gap: never from `RoutingStats`, whose reports are self-contained) is not applied: the view stays as it
was until the next summary, and `snapshot()` counts it.

The router runs in the caller's process. A request whose handle call carries no `routing=` keyword (or a replica
that has not reported yet) is still routed, by load. These Ray APIs are marked alpha: keep the pin in pyproject.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

try:
    from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
except ImportError as exc:
    raise ImportError(f"hf_paged.scaleout.ray_router needs the ray extra ({exc.name} is missing): "
                      "pip install 'hf_paged[ray]'") from None

from hf_paged.scaleout import registry
from hf_paged.scaleout.cache_events import CacheEvents
from hf_paged.scaleout.policy import CacheAwareRouter, RouterConfig, RouteRequest, RoutingDecision
from hf_paged.scaleout.prompt_key import RoutingInfo
from hf_paged.scaleout.summary import CacheSummary

__all__ = ["HfPagedRequestRouter", "RoutingInfo"]

logger = logging.getLogger("hf_paged.scaleout")

_MAX_DECISIONS = 100_000


@dataclass(frozen=True, slots=True)
class ViewReadiness:
    """How complete the router's view is (the gateway's readiness)."""

    num_known: int  # replicas Serve has given the router
    num_reported: int  # ... whose first report (a cache summary) has arrived: taken before the next choice
    deployment_id: Any = None  # the deployment the router routes to (Serve's DeploymentID)


class HfPagedRequestRouter(RequestRouter):
    """Ray Serve request router over `CacheAwareRouter`; `request_router_kwargs` are `RouterConfig` fields plus
    `seed`."""

    def initialize_state(self, **kwargs: Any) -> None:
        seed = kwargs.pop("seed", 0)
        self.policy = CacheAwareRouter(RouterConfig(**kwargs), seed=seed)
        self._summaries: dict[ReplicaID, CacheSummary] = {}  # last summary taken from each replica
        self._event_cursor: dict[ReplicaID, int] = {}  # the last block event applied (or the summary's event_seq)
        self.num_event_gaps = 0
        self._decisions: dict[str, tuple[RouteRequest, RoutingDecision]] = {}  # internal request id -> choice
        self._unaccepted: dict[str, PendingRequest] = {}  # booked at the choice, not yet accepted by a replica
        registry.register(self)

    def snapshot(self) -> dict[str, Any]:
        """The router's view, for debugging: known replicas with their load, work share and reports."""
        policy = self.policy
        replicas = {str(rid.unique_id): policy.replica_stats(rid) for rid in policy.replica_ids}
        now = time.time()
        for rid in policy.replica_ids:  # how stale the router's view of each replica is (None: no summary yet)
            summary = self._summaries.get(rid)
            replicas[str(rid.unique_id)]["summary_age_s"] = None if summary is None else round(summary.age(now), 3)
        return {"replicas": replicas, "routed": {reason.value: n for reason, n in policy.num_routed.items()},
                "event_gaps": self.num_event_gaps}

    def view_readiness(self) -> ViewReadiness:
        """Replicas known and reported. Read-only (the gateway calls it from its own thread): the replica map is
        swapped whole by Serve, a report is a dict; `choose_replicas` takes every candidate's report first."""
        replicas = list(self.curr_replicas.values())
        reported = sum(1 for r in replicas if isinstance(r.routing_stats, dict) and "seq" in r.routing_stats)
        return ViewReadiness(len(replicas), reported, getattr(self, "_deployment_id", None))

    # -- membership ----------------------------------------------------------------------------------------
    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.policy.sync_replicas(r.replica_id for r in replicas)
        live = {r.replica_id for r in replicas}
        self._summaries = {k: v for k, v in self._summaries.items() if k in live}
        self._event_cursor = {k: v for k, v in self._event_cursor.items() if k in live}

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.remove_replica(replica_id)  # forget its cache summary at once
        self._summaries.pop(replica_id, None)
        self._event_cursor.pop(replica_id, None)

    # -- routing -------------------------------------------------------------------------------------------
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id: r for r in candidate_replicas}
        for replica in candidate_replicas:
            self.policy.add_replica(replica.replica_id)  # no-op when known
            self._take_report(replica)
        self._drop_cancelled()
        request = self._route_request(pending_request)
        decision = self.policy.route(request, candidates=list(by_id))
        if pending_request is not None:
            iid = pending_request.metadata.internal_request_id
            self._decisions[iid] = (request, decision)
            if len(self._decisions) > _MAX_DECISIONS:  # requests cancelled before they were sent: drop the oldest
                del self._decisions[next(iter(self._decisions))]
            # Count the first choice now (an earlier choice for the same request moves): the next choices see it
            self.policy.book(request, decision.replica_ids[0])
            self._unaccepted.pop(iid, None)
            self._unaccepted[iid] = pending_request
            if len(self._unaccepted) > _MAX_DECISIONS:  # never accepted, completed nor cancelled: drop the oldest
                oldest = next(iter(self._unaccepted))
                del self._unaccepted[oldest]
                self.policy.unbook(oldest)
        ranked = [by_id[rid] for rid in decision.replica_ids]
        # The first choice alone, then the runner-up, then everyone else: a busy favourite (max_ongoing_requests)
        # falls back at once instead of making Serve retry the same rank.
        rest = [r for r in candidate_replicas if r not in ranked]
        return [[r] for r in ranked] + ([rest] if rest else [])

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        iid = pending_request.metadata.internal_request_id
        self._unaccepted.pop(iid, None)
        entry = self._decisions.get(iid)
        if entry is not None:
            self.policy.on_routed(entry[0], replica_id, entry[1])  # confirms the booking, moved if need be

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if self._unaccepted.pop(internal_request_id, None) is not None:
            # Rejected, or failed before the replica accepted it: undo the booking; Serve may choose again, so the
            # decision stays (if this call comes after the next choice's booking, on_routed books it afresh)
            self.policy.unbook(internal_request_id)
            return
        self._decisions.pop(internal_request_id, None)
        self.policy.on_finished(internal_request_id)

    # -- helpers -------------------------------------------------------------------------------------------
    def _drop_cancelled(self) -> None:
        """Undo the bookings of requests cancelled while they waited for a replica (Serve tells the router nothing)."""
        cancelled = [iid for iid, pr in self._unaccepted.items() if pr.future.cancelled()]
        for iid in cancelled:
            del self._unaccepted[iid]
            self._decisions.pop(iid, None)
            self.policy.unbook(iid)

    def _take_report(self, replica: RunningReplica) -> None:
        """Take a replica's summary if it is new, then its events past the cursor. The sequence numbers are read
        first: an unchanged report (most requests see one) is not unpacked at all."""
        stats = replica.routing_stats
        if not stats:
            return  # not reported yet
        seen = self._summaries.get(replica.replica_id)
        if seen is None or not isinstance(stats, dict) or stats.get("seq") != seen.seq:
            self._take_summary(replica, stats)
        if isinstance(stats, dict) and stats.get("events"):
            self._take_events(replica.replica_id, stats["events"])

    def _take_summary(self, replica: RunningReplica, stats: Any) -> None:
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
        self._event_cursor[replica.replica_id] = summary.event_seq
        self.policy.report(replica.replica_id, keys=summary.keys(), load_tokens=summary.load_tokens)

    def _take_events(self, replica_id: ReplicaID, stats: Any) -> None:
        cursor = self._event_cursor.get(replica_id)
        if cursor is None:
            return  # no summary taken: nothing to apply events to
        try:
            if int(stats["first_seq"]) + len(stats["kinds"]) - 1 <= cursor:
                return  # nothing new (the common case: read two numbers, unpack nothing)
            events = CacheEvents.from_stats(stats)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("ignoring %s's block events: %s", replica_id, exc)
            return
        if events.first_seq > cursor + 1:
            self.num_event_gaps += 1
            logger.warning("%s's block events start at %d, the router applied up to %d: they wait for its next "
                           "summary", replica_id, events.first_seq, cursor)
            return
        kinds, keys = events.after(cursor)
        self.policy.apply_events(replica_id, kinds, keys)
        self._event_cursor[replica_id] = events.last_seq

    @staticmethod
    def _route_request(pending_request: PendingRequest | None) -> RouteRequest:
        info = pending_request.kwargs.get("routing") if pending_request is not None else None
        rid = pending_request.metadata.internal_request_id if pending_request is not None else None
        if not isinstance(info, RoutingInfo):
            return RouteRequest(rid, (), num_prompt_tokens=0)  # nothing to match: routed by load
        return RouteRequest(rid, info.fingerprints, info.num_prompt_tokens, info.num_output_tokens,
                            getattr(info, "num_shared_tokens", 0))
