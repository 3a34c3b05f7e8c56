"""The routing simulator's parts (`benchmarks/routing_sim.py` is its face): workloads and traces, continuous-batching
replicas, routing policies."""
