"""Fixtures for the operator-surface tests: one real 3-node cluster shared by the CLI and metrics tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from folder_scope import close_when_folder_done

from admin_cli.main import main as brook_main
from deploy.local.cluster import LocalCluster

# Short enough that a paused/stopped follower leaves the ISR within a test's patience.
OPS_OVERRIDES = {"replica.lag.time.max.ms": "2000"}


@pytest.fixture(scope="session")
def ops_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("ops-cluster")
    cluster = LocalCluster(base, nodes=3, mode="combined", overrides=OPS_OVERRIDES)
    teardown = close_when_folder_done(__file__, cluster.teardown)
    try:
        cluster.start()
        cluster.wait_ready(90)
        yield cluster
    finally:
        teardown()


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]


@pytest.fixture
def brook(capsys: pytest.CaptureFixture[str], ops_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch):
    """Run the real `brook` CLI in-process against the ops cluster (BROOK_BOOTSTRAP is set)."""
    monkeypatch.setenv("BROOK_BOOTSTRAP", ops_cluster.bootstrap_servers)
    monkeypatch.setenv("COLUMNS", "200")  # wide tables: assertions need not care about wrapping

    def run(*args: str, stdin: str | None = None) -> Result:
        if stdin is not None:
            import io
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = brook_main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
