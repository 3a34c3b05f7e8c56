"""`hf-paged serve --replicas N [--address ADDR]`: the same server, as N engine replicas on Ray Serve.

It keeps the single server's promise on SIGTERM (or Ctrl-C): new requests get 503 at once, the requests in flight
get `--shutdown-timeout` seconds, what still runs then is aborted (each client gets the single server's error), and
the process exits 0 (130 after Ctrl-C) once every process it started has stopped. A local cluster (no `--address`)
runs in a temporary directory of its own, removed at exit, and without Ray's dashboard.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

__all__ = ["run_replicas"]

logger = logging.getLogger("hf_paged.scaleout")

READY_TIMEOUT_S = 120.0  # after serve.run: the replicas' first reports reach the router in ~1 s (a stats period)
FLUSH_GRACE_S = 5.0  # after the abort at --shutdown-timeout: time for the replicas' error answers to reach clients
PROXY_READY_TIMEOUT_S = "60"  # Serve's proxy start-up bound in a cluster this command starts (Serve's default: 5 s)


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
    try:
        import ray  # noqa: F401 -- checked here, used in _LocalCluster
        from ray import serve  # noqa: F401

        from hf_paged.scaleout.deploy import deploy
        from hf_paged.scaleout.gateway import wait_until_ready
    except ImportError as exc:
        raise CliError(f"--replicas needs the ray extra ({exc.name} is missing): pip install 'hf_paged[ray]'") from None
    log_to_stderr(args.log_level)
    cluster = _LocalCluster(args.address)
    port = _free_port(args.host) if args.port == 0 else args.port  # Serve's proxy: a port it can be told, and logged
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
                        generation_config=args.generation_config,
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


class _LocalCluster:
    """The Ray cluster this command starts (none with `--address`): lean, in its own temporary directory, and
    stopped with every process it started."""

    def __init__(self, address: str | None) -> None:
        self.address, self.temp_dir = address, None
        self.pids: set[tuple[int, int]] = set()  # (pid, start time) of every process below this one

    def start(self) -> None:
        import tempfile

        import ray

        from hf_paged.scaleout.deploy import worker_env

        if self.address is None:
            self.temp_dir = tempfile.mkdtemp(prefix="hf_paged-ray-")  # Ray's sockets and logs; short: socket paths
            # Serve kills a proxy not ready within 5 s and the command died with ActorDiedError (4 of 5 starts at load
            # 15-23 on 2 cores); the raylet, and so Serve's controller, inherit this process's environment
            os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", PROXY_READY_TIMEOUT_S)
        try:
            ray.init(address=self.address, include_dashboard=False, runtime_env=worker_env(),
                     _temp_dir=self.temp_dir)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            from hf_paged.errors import CliError

            where = f"the Ray cluster at --address {self.address!r}" if self.address else "a local Ray cluster"
            raise CliError(f"could not start or join {where}: {exc}".splitlines()[0]) from None

    def check_cpus(self, replicas: int) -> None:
        """A local cluster has this machine's CPUs, one per replica: more replicas would wait to be scheduled
        forever (Serve's deploy blocks before any timeout of ours). A cluster given by --address may grow."""
        import ray

        from hf_paged.errors import CliError

        if self.address is not None or not ray.is_initialized():
            return
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if replicas > cpus:
            raise CliError(f"--replicas {replicas} needs {replicas} CPUs (one per replica) but the local Ray "
                           f"cluster has {cpus}: lower --replicas, or join a larger cluster with --address")

    def stop(self) -> None:
        """Serve and the cluster down; then any process of ours still alive gets SIGTERM, then SIGKILL (Ray's
        agents otherwise outlive the raylet by up to a minute)."""
        import shutil

        import ray
        from ray import serve

        if not ray.is_initialized():  # stopped while Ray started: what it started so far goes too
            if self.address is None and self.temp_dir is not None:
                _reap(_descendants(), grace_s=3.0)
                shutil.rmtree(self.temp_dir, ignore_errors=True)
            return
        self.pids = _descendants()
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            if self.address is None:
                _reap(self.pids, grace_s=3.0)
                shutil.rmtree(self.temp_dir, ignore_errors=True)


def _free_port(host: str) -> int:
    """A port free on `host` now, for `--port 0` (Serve's proxy is told a port; the single server binds 0 itself)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _descendants() -> set[tuple[int, int]]:
    """(pid, start time) of every process below this one, read from /proc (Linux; empty elsewhere)."""
    import os

    parents: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        stat = _stat(name) if name.isdigit() else None
        if stat is not None:
            parents.setdefault(stat[1], []).append((int(name), stat[2]))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), ()):
            found.add(child)
            todo.append(child[0])
    return found


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in ticks) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _alive(pids: set[tuple[int, int]]) -> set[tuple[int, int]]:
    out = set()
    for pid, start in pids:
        stat = _stat(str(pid))
        if stat is not None and stat[2] == start and stat[0] != "Z":
            out.add((pid, start))
    return out


def _reap(pids: set[tuple[int, int]], grace_s: float) -> None:
    """SIGTERM whatever of `pids` is still alive, wait up to `grace_s`, SIGKILL the rest."""
    import os

    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = _alive(pids)
        if alive:
            logger.info("%d processes outlived the cluster; sending %s", len(alive), sig.name)
        for pid, _ in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = _alive(alive)
        if not alive:
            return
        logger.warning("%d processes outlived %s: %s", len(alive), sig.name, sorted(pid for pid, _ in alive))
