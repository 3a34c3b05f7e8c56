"""Scale-out: cache-aware routing over engine replicas.

    replica.py  ReplicaReporter  engine -> CacheSummary (its radix tree's fingerprints + load), once a period
    summary.py  CacheSummary     the wire format: 8 bytes a cached block, prefix-closed, capped
    cache_events.py CacheEvents  the radix tree's stored / removed blocks after a summary, 9 bytes an event
    routing_stats.py RoutingStats  a replica's report per poll: a summary now and then, the events after it
    policy.py   CacheAwareRouter summaries + what it sent -> ranked replicas (affinity by prefill saved, relative
                                 load bounds, shared prefixes ignored, hot prefixes spread)
    replica_view.py ReplicaView  what the router believes one replica holds and carries
    traffic.py  PrefixTraffic    decayed load share of each prefix (which prefixes are hot)
  with Ray (hf_paged[ray]), imported on demand:
    ray_router.py  HfPagedRequestRouter  the policy as a Ray Serve RequestRouter
    deploy.py      deploy(), EngineReplica, Gateway: N replicas behind one endpoint (asgi.py, prompt_key.py)
    metrics_merge.py  every replica's /metrics text as one, a `replica` label per sample (pure text, no Ray)
    kv_roles.py    prefill/decode disaggregation: a replica's role (its KV connector over Ray's object store), the
                   one-token body a prefill replica gets
    pd_gateway.py  DisaggGateway: prefill on a prefill replica, then the request to a decode replica
    pd_placement.py  place_prefill, PlacementLedger: per prompt, the prefill replica or a local chunked prefill
    kv_share.py    attach_kv_share: colocated replicas share hot prefixes through one object-store directory
    cli.py         hf-paged serve --replicas N [--prefill-replicas P | --kv-share] [--address ADDR]
    local_cluster.py  LocalCluster: the Ray cluster cli.py starts, in a session of its own (a group signal misses it)

The policy imports neither Ray nor torch: it is tested and simulated alone (`benchmarks/routing_sim.py`).
"""

from hf_paged.scaleout.policy import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest, RoutingDecision
from hf_paged.scaleout.summary import CacheSummary, build_summary, fingerprint, prompt_fingerprints
from hf_paged.scaleout.traffic import PrefixTraffic

__all__ = [
    "CacheAwareRouter", "CacheSummary", "PrefixTraffic", "RouteReason", "RouteRequest", "RouterConfig",
    "RoutingDecision", "build_summary", "fingerprint", "prompt_fingerprints",
]
