"""`hf-paged serve --replicas N [--address ADDR]`: the same server, as N engine replicas on Ray Serve.

It keeps the single server's promise on SIGTERM (or Ctrl-C): new requests get 503 at once, the requests in flight
get `--shutdown-timeout` seconds, what still runs then is aborted (each client gets the single server's error), and
the process exits 0 (130 after Ctrl-C) once every process it started has stopped. A local cluster (no `--address`)
runs in a temporary directory and a session of its own (`local_cluster.py`: a signal to the command's process group
reaches the command only), removed at exit, and without Ray's dashboard.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from hf_paged.scaleout.local_cluster import LocalCluster, free_port

__all__ = ["run_replicas"]

logger = logging.getLogger("hf_paged.scaleout")

READY_TIMEOUT_S = 120.0  # after serve.run: the replicas' first reports reach the router in ~1 s (a stats period)
FLUSH_GRACE_S = 5.0  # after the abort at --shutdown-timeout: time for the replicas' error answers to reach clients


def run_replicas(args) -> int:
    """Deploy the replicas with the single-server flags and serve until SIGTERM / Ctrl-C. Raises `CliError` for bad
    arguments (checked before Ray starts)."""
    from hf_paged.errors import CliError
    from hf_paged.serving.auth import KeyCheck
    from hf_paged.serving.server import (
        check_generation_config,
        checked_paged_config,
        log_to_stderr,
        paged_overrides,
        read_chat_template,
        serve_api_key,
    )

    stop = _StopSignals()
    stop.install()  # from the start: a signal during the imports and checks ends the command before Ray starts
    replicas = 1 if args.replicas is None else args.replicas  # --address alone: one replica on that cluster
    if replicas < 1:
        raise CliError(f"--replicas must be >= 1, got {replicas}")
    prefill_replicas = getattr(args, "prefill_replicas", None) or 0  # prefill/decode disaggregation (kv_roles.py)
    if prefill_replicas and not 0 < prefill_replicas < replicas:
        raise CliError(f"--prefill-replicas must leave at least one decode replica: 1 .. {replicas - 1} with "
                       f"--replicas {replicas}, got {prefill_replicas}")
    kv_share = bool(getattr(args, "kv_share", False))  # colocated replicas share hot prefixes (kv_share.py)
    if kv_share and prefill_replicas:
        raise CliError("--kv-share is for colocated replicas; with --prefill-replicas the decode replicas already "
                       "load the prefill replicas' blocks: drop one of the two")
    if args.no_prefix_caching:
        raise CliError("--replicas routes by the replicas' prefix caches: drop --no-prefix-caching")
    checked_paged_config(args)
    check_generation_config(args)
    api_key = serve_api_key(args)
    paged = paged_overrides(args)  # --no-prefix-caching is refused above: the replicas route by their caches
    template = read_chat_template(args)
    cluster = LocalCluster(args.address)  # before Ray's import: it reads its authentication settings there
    try:
        import ray  # noqa: F401 -- checked here, used in local_cluster.py
        from ray import serve  # noqa: F401

        from hf_paged.scaleout.deploy import deploy
        from hf_paged.scaleout.gateway import wait_until_ready
    except ImportError as exc:
        raise CliError(f"--replicas needs the ray extra ({exc.name} is missing): pip install 'hf_paged[ray]'") from None
    log_to_stderr(args.log_level)
    port = free_port(args.host) if args.port == 0 else args.port  # Serve's proxy: a port it can be told, and logged
    if stop.event.is_set():
        return 130 if stop.interrupted else 0
    try:
        stop.armed = True  # a signal while Ray starts ends the start-up, cleaned up
        cluster.start()
        stop.install()  # again after ray.init: its core worker installs a handler that dumps core on SIGTERM
        cluster.check_cpus(replicas)
        handle = deploy(args.model, replicas=replicas, address=args.address, host=args.host, port=port,
                        served_model_name=args.served_model_name, device=args.device, dtype=args.dtype,
                        paged=paged, max_waiting=args.max_waiting, chat_template=template,
                        prefill_replicas=prefill_replicas, kv_share=kv_share,
                        generation_config=args.generation_config, max_cache_retention_s=args.max_cache_retention,
                        max_stop_sequences=args.max_stop_sequences,
                        api_key=None if api_key is None else KeyCheck.from_key(api_key))
        state = wait_until_ready(handle, READY_TIMEOUT_S)  # every replica reported to the router
        if not state.ready:
            raise CliError(f"{state.num_reported} of {replicas} replicas reported to the router within "
                           f"{READY_TIMEOUT_S:.0f} s ({state.num_known} known); see the replicas' logs")
        logger.info("serving %s on http://%s:%d (%d replicas on Ray Serve)",
                    args.served_model_name or args.model or "hf-paged/tiny-lm", args.host, port, replicas)
        stop.serving = True
        stop.wait()
        drain(handle, args.shutdown_timeout)
    except _Stopped:  # a signal during start-up: nothing to drain
        pass
    except SystemError:  # _Stopped raised inside Ray's C code (a signal in `ray.get` during start-up) comes out so
        if not stop.event.is_set():
            raise
    finally:
        cluster.stop()
    return 130 if stop.interrupted else 0


def drain(gateway, shutdown_timeout: float, flush_s: float = FLUSH_GRACE_S) -> int:
    """Close the gateway to new requests, give those in flight `shutdown_timeout` seconds, abort the rest and give
    their error answers `flush_s` seconds. Returns the number aborted."""
    def call(method: str):
        return gateway.options(method_name=method).remote().result(timeout_s=30)

    def wait(seconds: float) -> int:
        num_in_flight, deadline = call("num_in_flight"), time.monotonic() + seconds
        while num_in_flight and time.monotonic() < deadline:
            time.sleep(0.1)
            num_in_flight = call("num_in_flight")
        return num_in_flight

    num_in_flight = call("begin_drain")
    logger.info("shutting down: %d requests in flight get %.3g s", num_in_flight, shutdown_timeout)
    aborted = wait(shutdown_timeout) if num_in_flight else 0
    if aborted:
        logger.info("aborting %d requests still running", aborted)
        call("abort_all")
        wait(flush_s)
    return aborted


class _Stopped(Exception):
    """SIGTERM / Ctrl-C before the replicas were ready."""


class _StopSignals:
    """SIGTERM and SIGINT set an event once serving (a second one is ignored: the drain is under way); before
    that they abort the start-up once it is `armed` (before: the command ends where it checks the event)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.armed = False  # raise `_Stopped` (start-up under way, cleaned up in a `finally`); before: only the event
        self.serving = False
        self.interrupted = False  # Ctrl-C (exit 130) rather than SIGTERM (exit 0)

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.event.is_set():
            return
        self.interrupted = signum == signal.SIGINT
        self.event.set()
        if self.armed and not self.serving:
            raise _Stopped

    def wait(self) -> None:
        while not self.event.wait(1.0):  # a timed wait lets the handler run promptly
            pass
