"""The Ray cluster `hf-paged serve --replicas` starts for itself (none with `--address`), out of the reach of a signal
sent to the command's process group, and stopped with every process it started.

    this command (the supervisor's process group)        its own session (setsid)
      driver: ray.init(address=127.0.0.1:PORT)  ----->   `ray start --head --block`  (a child: dies with us)
                                                           GCS, raylet, agents, Serve's controller, proxy, replicas

Why a session of its own: a supervisor that stops a process group (`timeout`, `kill -- -PGID`, docker's `tini -g`,
a shell's Ctrl-C) also reached Ray's GCS and raylet when `ray.init()` started them in ours; they died at once, so
nothing in flight was drained and Serve's shutdown then waited 30 s for a controller that was gone. Started apart,
only this command hears the signal; it drains, then stops the cluster itself. `--block` keeps `ray start` as the
parent of Ray's processes (Ray binds them to it: they die with it), and this command binds `ray start` to itself
(Linux `PR_SET_PDEATHSIG`), so a SIGKILL of the command still takes the cluster down. A cgroup-wide kill (systemd's
default `KillMode=control-group`) reaches every process whatever its session: there `KillMode=mixed` is the fix.
The cluster's temporary directory (`hf_paged-ray-*`) records the command's and `ray start`'s pid and start time; a
SIGKILL leaves it behind, and the next start removes it once both are gone (`remove_stale_dirs`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["LocalCluster", "free_port"]

logger = logging.getLogger("hf_paged.scaleout")

PROXY_READY_TIMEOUT_S = "60"  # Serve's proxy start-up bound in a cluster this command starts (Serve's default: 5 s)
HEAD_START_TIMEOUT_S = 120.0  # `ray start --head` to "started" (~5 s idle; minutes at load 20 on 2 cores)
TEMP_PREFIX = "hf_paged-ray-"  # the local cluster's temporary directory (`--temp-dir`), in the temporary folder
OWNERS_FILE = "hf_paged-owners"  # in it: "pid start-time" of the command and of `ray start`, a line each
HEAD_STOP_GRACE_S = 10.0  # `ray start --block` stops its processes on SIGTERM (~1-2 s), then this command reaps


class LocalCluster:
    """The Ray cluster this command starts (none with `--address`: that cluster is joined, never stopped): lean (no
    dashboard), in its own temporary directory and session, and stopped with every process it started."""

    def __init__(self, address: str | None) -> None:
        """Build it before Ray is imported: a local cluster sets Ray's authentication in this process's environment
        (`_auth_env`)."""
        self.address, self.temp_dir = address, None  # address: --address (a cluster not ours), else None
        self.head_env = _auth_env() if address is None else {}  # added to the head's environment
        self.head: subprocess.Popen | None = None  # `ray start --head --block`, in a session of its own
        self.pids: set[tuple[int, int]] = set()  # (pid, start time) of every process below this one

    def start(self) -> None:
        import tempfile

        import ray

        from hf_paged.scaleout.deploy import worker_env

        address = self.address
        if address is None:
            remove_stale_dirs(tempfile.gettempdir())  # left by a command killed with SIGKILL
            self.temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX)  # Ray's sockets and logs; short: socket paths
            _write_owners(self.temp_dir, [os.getpid()])
            # Serve kills a proxy not ready within 5 s and the command died with ActorDiedError (4 of 5 starts at load
            # 15-23 on 2 cores); the raylet, and so Serve's controller, inherit the head's environment
            env = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": PROXY_READY_TIMEOUT_S, **os.environ, **self.head_env}
            address = self._start_head(env)
            if self.head is not None:  # the head's processes use it until it ends
                _write_owners(self.temp_dir, [os.getpid(), self.head.pid])
        try:
            ray.init(address=address, runtime_env=worker_env(),
                     **({"include_dashboard": False} if self.address is not None else {}))
        except (ConnectionError, ValueError, RuntimeError) as exc:
            from hf_paged.errors import CliError

            where = f"the Ray cluster at --address {self.address!r}" if self.address else "a local Ray cluster"
            raise CliError(f"could not start or join {where}: {exc}".splitlines()[0]) from None

    def _start_head(self, env: dict[str, str]) -> str:
        """`ray start --head --block` in a new session; returns its GCS address once it says it started."""
        from hf_paged.errors import CliError

        port = free_port("127.0.0.1")
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                   "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir", self.temp_dir,
                   "--include-dashboard", "false"]
        bind = _die_with_parent()
        self.head = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                                     preexec_fn=bind)  # noqa: PLW1509 -- one prctl call, no lock (as Ray's own)
        started, lines = threading.Event(), []
        threading.Thread(target=_follow, args=(self.head.stdout, lines, started), daemon=True,
                         name="hf_paged-ray-head").start()
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        while not started.wait(0.2):  # a timed wait: a signal's handler runs between waits
            if self.head.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with status {self.head.returncode}" if self.head.returncode is not None
                       else f"not started within {HEAD_START_TIMEOUT_S:.0f} s")
                tail = " | ".join(line.strip() for line in lines[-5:] if line.strip())
                raise CliError(f"could not start a local Ray cluster: `ray start --head` {why}: {tail}")
        return f"127.0.0.1:{port}"

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
        """Serve and the cluster down: `ray start` gets SIGTERM and stops its processes; then any process of ours
        still alive gets SIGTERM, then SIGKILL (Ray's agents otherwise outlive the raylet by up to a minute). A
        cluster given by --address keeps running, and so do the other Serve applications on it (`_leave_serve`)."""
        import shutil

        import ray
        from ray import serve

        self.pids = _descendants()  # the head's tree too: `--block` keeps it its processes' parent
        try:
            if ray.is_initialized() and self.address is None:
                serve.shutdown()
            elif ray.is_initialized():
                _leave_serve(serve)
        finally:
            if ray.is_initialized():
                ray.shutdown()
            if self.address is None:
                self._stop_head()
                _reap(self.pids, grace_s=3.0)
                if self.temp_dir is not None:
                    shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _stop_head(self) -> None:
        if self.head is None or self.head.poll() is not None:
            return
        self.head.terminate()
        try:
            self.head.wait(timeout=HEAD_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            logger.warning("`ray start --head` outlived SIGTERM by %.0f s; reaping it", HEAD_STOP_GRACE_S)


def _leave_serve(serve) -> None:
    """Leave a joined cluster's Serve as it was before this command, but for our application: others' applications
    keep running (`serve.shutdown()`, what Ray's own `serve run` does at exit, would delete every application on the
    cluster); Serve itself is shut down only when no application is left on it."""
    from hf_paged.scaleout.deploy import APP_NAME

    serve.delete(APP_NAME)
    if not serve.status().applications:
        serve.shutdown()


def _auth_env() -> dict[str, str]:
    """Ray's authentication for the cluster this command starts: the head and this command's driver must agree, and
    Ray reads the mode once, at its import. Left to `ray start` and the driver they disagreed once ~/.ray/auth_token
    existed (the head took it, the driver, given an address, did not) and the driver retried the GCS forever. Before
    Ray's import (the command): token authentication, as `ray.init()` gives a cluster it starts, with a token of this
    cluster's own (none written to ~/.ray), set in this process's environment too. A user's RAY_AUTH_MODE and token
    are kept. Returns what the head's environment adds."""
    import secrets

    if "RAY_AUTH_MODE" in os.environ:
        return {}  # the user's choice, for the head and the driver alike
    if "ray" in sys.modules:  # this process's Ray has its mode already: none (it connects to an address)
        logger.warning("ray was imported before the local cluster was set up: the cluster runs without token "
                       "authentication (set RAY_AUTH_MODE=token before importing ray to have it)")
        return {"RAY_AUTH_MODE": "disabled"}
    env = {"RAY_AUTH_MODE": "token"}
    if not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ):
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ.update(env)
    return env


def _follow(stream, lines: list[str], started: threading.Event) -> None:
    """Read `ray start`'s output to its end (a full pipe would block it), logged at debug level; `started` once it
    has started its processes (it then blocks, printing nothing more unless one dies)."""
    for line in stream:
        lines.append(line)
        logger.debug("ray start: %s", line.rstrip())
        if "Ray runtime started" in line or "--block" in line:
            started.set()


def _die_with_parent() -> Callable[[], None] | None:
    """For `Popen(preexec_fn=...)` (Linux): the child gets SIGTERM when this command dies without stopping it (killed,
    or a crash), and stops its processes: all 14 were gone 33 s after a SIGKILL of the command. (SIGKILL here took
    most at once, but Ray's dashboard and runtime-env agents outlived it by over 60 s.) libc is loaded here, before
    the fork: the child runs only the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl, pr_set_pdeathsig = ctypes.CDLL(None, use_errno=True).prctl, 1  # <sys/prctl.h>
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM))


def free_port(host: str) -> int:
    """A port free on `host` now (Serve's proxy and `ray start --port` are told a port)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _write_owners(temp_dir: str, pids: list[int]) -> None:
    """Record who uses `temp_dir` (written whole, then renamed: a sweep never reads half a file)."""
    lines = [f"{pid} {stat[2]}\n" for pid in pids if (stat := _stat(str(pid))) is not None]
    path = os.path.join(temp_dir, OWNERS_FILE)
    with open(path + ".new", "w") as f:
        f.writelines(lines)
    os.replace(path + ".new", path)


def remove_stale_dirs(parent: str) -> list[str]:
    """Remove the `hf_paged-ray-*` directories in `parent` whose recorded processes (the command, `ray start`) are all
    gone: a command killed with SIGKILL cannot remove its own, and Ray's processes stop only after it (pdeathsig),
    so the directory stays. A directory without the record (being created, or left by an older version), another
    user's, or one whose command or head still runs (pid and start time both match) is kept. Returns those removed."""
    import shutil

    removed = []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else ():
        path = os.path.join(parent, name)
        if not name.startswith(TEMP_PREFIX) or not os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            with open(os.path.join(path, OWNERS_FILE)) as f:
                owners = {(int(pid), int(start)) for pid, start in (line.split() for line in f if line.strip())}
        except (OSError, ValueError):
            continue
        if owners and not _alive(owners):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("removed %d temporary directories of Ray clusters whose command was killed", len(removed))
    return removed


def _descendants() -> set[tuple[int, int]]:
    """(pid, start time) of every process below this one, read from /proc (Linux; empty elsewhere)."""
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
