"""`hf-paged serve --replicas N`: argument errors are one line and exit status 2, before Ray starts."""

from __future__ import annotations

import pytest

from hf_paged.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["serve", "--replicas", "2", "--no-prefix-caching"], "drop --no-prefix-caching"),
    (["serve", "--replicas", "2", "--block-size", "3"], "block_size must be a power of two"),
    (["serve", "--replicas", "2", "--max-waiting", "0"], "--max-waiting must be >= 1"),
    (["serve", "--replicas", "2", "--chat-template", "/no/template.jinja"], "chat template file"),
    (["serve", "--replicas", "x"], "argument --replicas: invalid int value"),
    (["serve", "--replicas", "2", "--prefill-replicas", "2"], "--prefill-replicas must leave at least one decode"),
    (["serve", "--replicas", "3", "--prefill-replicas", "-1"], "--prefill-replicas must leave at least one decode"),
    (["serve", "--prefill-replicas", "1"], "--prefill-replicas splits the replicas of --replicas N"),
])
def test_bad_replica_arguments_fail_before_ray_starts(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
