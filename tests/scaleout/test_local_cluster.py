"""The local cluster's settings (`scaleout/local_cluster.py`), without starting Ray: its authentication agrees with
the driver's, `ray start` runs in a session of its own, bound to the command, and a killed command's temporary
directory goes at the next start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hf_paged.scaleout import local_cluster
from hf_paged.scaleout.local_cluster import LocalCluster

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}


def _in_fresh_process(code: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_before_rays_import_the_cluster_and_the_driver_get_one_token_of_its_own():
    """~/.ray/auth_token made `ray start` require a token the driver (given an address) never sent: it retried the
    GCS for minutes. Both now run in token mode with the cluster's own token."""
    got = _in_fresh_process("""
        import json, os, sys
        from hf_paged.scaleout.local_cluster import LocalCluster
        cluster = LocalCluster(None)
        print(json.dumps({"head": cluster.head_env, "mode": os.environ.get("RAY_AUTH_MODE"),
                          "token": os.environ.get("RAY_AUTH_TOKEN"), "ray": "ray" in sys.modules}))
    """, CLEAN)
    assert got["ray"] is False and got["mode"] == "token" and len(got["token"]) == 64
    assert got["head"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": got["token"]}


def test_a_users_setting_is_kept_and_a_joined_cluster_is_left_alone(monkeypatch):
    got = _in_fresh_process("""
        import json, os
        from hf_paged.scaleout.local_cluster import LocalCluster
        print(json.dumps({"head": LocalCluster(None).head_env, "token": os.environ.get("RAY_AUTH_TOKEN")}))
    """, {**CLEAN, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "mine"})
    assert got == {"head": {}, "token": "mine"}
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert LocalCluster("ray://elsewhere:10001").head_env == {}
    assert "RAY_AUTH_MODE" not in os.environ


def test_after_rays_import_the_head_is_told_the_drivers_mode(monkeypatch):
    pytest.importorskip("ray")
    import ray  # noqa: F401 -- imported: this process's Ray read its (absent) mode

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    assert LocalCluster(None).head_env == {"RAY_AUTH_MODE": "disabled"}  # not ~/.ray/auth_token's token mode
    assert "RAY_AUTH_MODE" not in os.environ and "RAY_AUTH_TOKEN" not in os.environ


def test_ray_start_runs_in_its_own_session_and_dies_with_the_command(monkeypatch, tmp_path):
    """What `_start_head` gives `ray start` (a stand-in here): a session of its own (a signal to the command's group
    misses it) and SIGTERM when the command dies."""
    seen = {}

    class Popen:
        def __init__(self, command, **kwargs):
            seen.update(kwargs, command=command)
            raise OSError("stop here")

    monkeypatch.setattr(local_cluster.subprocess, "Popen", Popen)
    cluster = LocalCluster.__new__(LocalCluster)
    cluster.temp_dir = str(tmp_path)
    with pytest.raises(OSError, match="stop here"):
        cluster._start_head({})
    assert seen["start_new_session"] is True and callable(seen["preexec_fn"])
    command = seen["command"]
    assert {"--head", "--block"} <= set(command) and command[command.index("--temp-dir") + 1] == str(tmp_path)


class _FakeServe:
    """What `LocalCluster.stop` asks of `ray.serve` on a joined cluster, recorded."""

    def __init__(self, others: list[str]) -> None:
        self.apps, self.calls = ["hf_paged", *others], []

    def delete(self, name: str) -> None:
        self.calls.append(("delete", name))
        self.apps.remove(name)

    def status(self):
        return type("Status", (), {"applications": {name: None for name in self.apps}})()

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))
        self.apps.clear()


@pytest.mark.parametrize("others", [["someone_elses_app"], []], ids=["shared", "ours-alone"])
def test_leaving_a_joined_cluster_deletes_only_our_application(monkeypatch, others):
    """`serve.shutdown()` at exit (Ray's own `serve run` does it) deleted every Serve application on a cluster given
    by --address, other people's too; now only ours goes, and Serve with it only when nothing else runs there."""
    import ray
    from ray import serve

    fake = _FakeServe(others)
    for name in ("delete", "status", "shutdown"):
        monkeypatch.setattr(serve, name, getattr(fake, name))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(local_cluster, "_descendants", set)
    LocalCluster("ray://head:10001").stop()
    assert fake.calls == ([("delete", "hf_paged")] if others else [("delete", "hf_paged"), ("shutdown",)])
    assert fake.apps == others


_KILLED_COMMAND = """
import os, subprocess, sys, time
import ray
from hf_paged.scaleout import local_cluster
def start_head(self, env):  # a stand-in `ray start --head --block`: a process that outlives the command for a while
    self.head = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    return "127.0.0.1:1"
local_cluster.LocalCluster._start_head = start_head
ray.init = lambda **kwargs: None
cluster = local_cluster.LocalCluster(None)
cluster.start()
print(cluster.temp_dir, cluster.head.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_commands_temporary_directory_goes_at_the_next_start_once_its_processes_are_gone(tmp_path):
    """After a SIGKILL of `serve --replicas` nothing of it can remove its `hf_paged-ray-*` directory: the next start
    removes it, but only once the command and its `ray start` (still running Ray's processes) are both gone."""
    pytest.importorskip("ray")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = subprocess.Popen([sys.executable, "-c", _KILLED_COMMAND], env=env, stdout=subprocess.PIPE, text=True)
    head_pid = None
    try:
        temp_dir, head_pid = command.stdout.readline().split()
        head_pid = int(head_pid)
        assert os.path.dirname(temp_dir) == str(tmp_path)
        mine = tmp_path / "hf_paged-ray-new"  # another command creating its directory (no record yet): kept
        mine.mkdir()
        assert local_cluster.remove_stale_dirs(str(tmp_path)) == []  # the command runs
        command.kill()
        command.wait()
        assert local_cluster.remove_stale_dirs(str(tmp_path)) == []  # its `ray start` still runs
        os.kill(head_pid, signal.SIGKILL)  # (not our child: reaped by init, or a zombie, which counts as gone)
        for _ in range(600):
            stat = local_cluster._stat(str(head_pid))
            if stat is None or stat[0] == "Z":
                break
            time.sleep(0.05)
        assert local_cluster.remove_stale_dirs(str(tmp_path)) == [temp_dir]
        assert not os.path.exists(temp_dir) and mine.is_dir()
    finally:
        command.kill()
        command.wait()
        if head_pid is not None:
            try:
                os.kill(head_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
