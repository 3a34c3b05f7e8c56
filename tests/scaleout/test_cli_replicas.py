"""`hf-paged serve --replicas N`: argument errors are one line and exit status 2, before Ray starts."""

from __future__ import annotations

import os
import shutil

import pytest

from hf_paged.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["serve", "--replicas", "2", "--no-prefix-caching"], "drop --no-prefix-caching"),
    (["serve", "--replicas", "2", "--block-size", "3"], "block_size must be a power of two"),
    (["serve", "--replicas", "2", "--max-waiting", "-1"], "--max-waiting must be >= 0"),
    (["serve", "--replicas", "2", "--chat-template", "/no/template.jinja"], "chat template file"),
    (["serve", "--replicas", "x"], "argument --replicas: invalid int value"),
    (["serve", "--replicas", "2", "--prefill-replicas", "2"], "--prefill-replicas must leave at least one decode"),
    (["serve", "--replicas", "3", "--prefill-replicas", "-1"], "--prefill-replicas must leave at least one decode"),
    (["serve", "--prefill-replicas", "1"], "--prefill-replicas splits the replicas of --replicas N"),
    (["serve", "--served-model-name", ""], "--served-model-name is empty"),  # (the default name came instead)
    (["serve", "--replicas", "2", "--served-model-name", " "], "--served-model-name is empty"),
])
def test_bad_replica_arguments_fail_before_ray_starts(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_local_cluster_gives_serves_proxy_time_to_start(monkeypatch):
    """Serve kills a proxy not ready within its default 5 s: on a loaded machine `serve --replicas 2` died at start-up
    with ActorDiedError (4 of 5 starts at load 15-23). The cluster the command starts (`ray start --head`, whose
    environment its raylet and Serve's controller inherit) gets a 60 s bound; a user's own setting, and a cluster
    given by --address (joined, nothing started), are left alone."""
    ray = pytest.importorskip("ray")
    from hf_paged.scaleout.local_cluster import LocalCluster

    name = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
    seen, heads = [], []
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(kwargs["address"]))
    monkeypatch.setattr(LocalCluster, "_start_head", lambda self, env: heads.append(env.get(name)) or "127.0.0.1:1")
    monkeypatch.setenv(name, "unset below")  # (monkeypatch restores the variable after the test either way)
    monkeypatch.delenv(name)
    cluster = LocalCluster(None)
    cluster.start()
    shutil.rmtree(cluster.temp_dir)
    monkeypatch.setenv(name, "7")
    cluster.start()
    shutil.rmtree(cluster.temp_dir)
    monkeypatch.delenv(name)
    LocalCluster("ray://elsewhere:10001").start()
    assert heads == ["60", "7"] and os.environ.get(name) is None  # the command's own environment is unchanged
    assert seen == ["127.0.0.1:1", "127.0.0.1:1", "ray://elsewhere:10001"]


def test_ray_start_failures_and_too_many_replicas_are_one_line_errors(monkeypatch):
    """A bad --address gave a traceback (exit 1); more replicas than a local cluster's CPUs waited to be scheduled
    forever (Serve's deploy blocks before our readiness timeout)."""
    ray = pytest.importorskip("ray")
    from hf_paged.errors import CliError
    from hf_paged.scaleout.local_cluster import LocalCluster

    def refuse(**kwargs):
        raise ConnectionError("could not connect to ray://127.0.0.1:1\nthe rest of the story")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(CliError, match=r"^could not start or join the Ray cluster at --address 'ray://127.0.0.1:1': "
                                       r"could not connect to ray://127.0.0.1:1$"):
        LocalCluster("ray://127.0.0.1:1").start()
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    LocalCluster(None).check_cpus(2)
    LocalCluster("ray://elsewhere:10001").check_cpus(8)  # a cluster of its own may grow
    with pytest.raises(CliError, match="--replicas 3 needs 3 CPUs .* the local Ray cluster has 2"):
        LocalCluster(None).check_cpus(3)


def test_port_zero_is_a_free_port_told_to_serves_proxy():
    from hf_paged.scaleout.cli import free_port

    port = free_port("127.0.0.1")
    assert 0 < port < 65536


def test_api_key_and_generation_config_reach_the_deployment(monkeypatch, tmp_path):
    """`--api-key` (as its digest, never the key), `--generation-config`, `--max-stop-sequences` and
    `--max-cache-retention` go into the replicas' spec; a bad `--generation-config` is a one-line error before Ray
    starts. Was: the first two were refused with --replicas, the last read and dropped."""
    pytest.importorskip("ray")
    from hf_paged.scaleout import cli, deploy
    from hf_paged.serving import ServerSettings
    from hf_paged.serving.auth import KeyCheck

    seen = {}

    class Cluster:
        def __init__(self, address):
            pass

        def start(self):
            pass

        def check_cpus(self, n):
            pass

        def stop(self):
            seen["stopped"] = True

    class Deployed(Exception):
        pass

    def fake_deploy(model, **kwargs):
        seen.update(kwargs)
        raise Deployed

    monkeypatch.setattr(cli, "LocalCluster", Cluster)
    monkeypatch.setattr(deploy, "deploy", fake_deploy)
    monkeypatch.setenv("HF_PAGED_API_KEY", "s3cret")
    with pytest.raises(Deployed):
        main(["serve", "--replicas", "2", "--port", "8123", "--generation-config", "vllm", "--max-stop-sequences",
              "5", "--max-cache-retention", "0"])
    assert seen["generation_config"] == "vllm" and seen["stopped"]
    # the replicas' server settings (`--max-cache-retention` was read and dropped with --replicas before)
    settings = deploy.ReplicaSpec(max_stop_sequences=seen["max_stop_sequences"],
                                  max_cache_retention_s=seen["max_cache_retention_s"]).server_settings()
    assert (settings.max_stop_sequences, settings.max_cache_retention_s) == (5, 0)
    assert deploy.ReplicaSpec().server_settings().max_stop_sequences == ServerSettings().max_stop_sequences
    assert seen["api_key"] == KeyCheck.from_key("s3cret") and b"s3cret" not in repr(seen["api_key"]).encode()
    assert main(["serve", "--replicas", "2", "--generation-config", str(tmp_path)]) == 2  # no generation_config.json
