"""`hf-paged serve --kv-share`: refused without --replicas and beside --prefill-replicas (one line, exit 2, before Ray
starts); the flag reaches `deploy(kv_share=True)`."""

from __future__ import annotations

import pytest

from hf_paged.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--kv-share"], "--kv-share shares hot prefixes between the replicas of --replicas N"),
    (["serve", "--replicas", "3", "--prefill-replicas", "1", "--kv-share"], "--kv-share is for colocated replicas"),
])
def test_bad_kv_share_arguments_fail_before_ray_starts(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_the_flag_reaches_deploy(monkeypatch):
    from hf_paged.errors import CliError
    from hf_paged.scaleout import cli, deploy

    seen = {}

    def fake_deploy(model, **kwargs):
        seen.update(kwargs)
        raise CliError("stop here")  # before serving: only the arguments are checked

    monkeypatch.setattr(deploy, "deploy", fake_deploy)
    monkeypatch.setattr(cli.LocalCluster, "start", lambda self: None)
    monkeypatch.setattr(cli.LocalCluster, "stop", lambda self: None)
    monkeypatch.setattr(cli._StopSignals, "install", lambda self: None)
    assert main(["serve", "--replicas", "2", "--kv-share"]) == 2
    assert seen["kv_share"] is True and seen["prefill_replicas"] == 0
    seen.clear()
    assert main(["serve", "--replicas", "2"]) == 2
    assert seen["kv_share"] is False


def test_build_application_refuses_kv_share_beside_prefill_replicas():
    pytest.importorskip("ray")
    from hf_paged.scaleout.deploy import build_application
    from hf_paged.scaleout.spec import ReplicaSpec

    with pytest.raises(ValueError, match="kv_share is for colocated replicas"):
        build_application(ReplicaSpec(kv_share=True), replicas=3, prefill_replicas=1)
