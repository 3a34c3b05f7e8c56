"""One local Ray cluster for a test module: 2 CPUs (this machine's), no dashboard, the workers' environment, and
Serve's proxy given time to start on a loaded machine; shut down (Serve first, when the module started it) after."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def local_ray(*, serve: bool = False) -> Iterator[None]:
    import ray

    from hf_paged.scaleout.deploy import worker_env

    # Serve kills a proxy not ready within 5 s (its default), which a loaded machine misses: the raylet this starts,
    # and so the controller, inherit this process's environment
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=worker_env(), log_to_driver=False)
    try:
        yield
    finally:
        if serve:
            from ray import serve as ray_serve

            ray_serve.shutdown()
        ray.shutdown()
