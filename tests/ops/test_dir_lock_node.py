"""Two nodes must never write one directory: a node started on a running node's log or metadata
directory refuses to start with one line naming the holder, and the running node is untouched."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.local.cluster import LocalCluster, free_port


@pytest.mark.parametrize("role", ["broker", "controller"])
def test_a_second_node_on_a_running_nodes_directory_refuses_to_start(ops_cluster: LocalCluster, tmp_path: Path,
                                                                     role: str) -> None:
    held = ops_cluster.node_dir(1) / ("data" if role == "broker" else "meta")
    port, raft_port = free_port(), free_port()
    if role == "broker":
        keys = (f'"listeners" = "BROKER://127.0.0.1:{port}"\n"controller.quorum.voters" = "1@127.0.0.1:1:2"\n'
                f'"log.dirs" = "{held}"\n')
    else:
        keys = (f'"listeners" = "CONTROLLER://127.0.0.1:{port}"\n'
                f'"controller.quorum.voters" = "9@127.0.0.1:{port}:{raft_port}"\n"metadata.log.dir" = "{held}"\n'
                f'"controller.quorum.password" = "{secrets.token_urlsafe(24)}"\n')
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'"process.roles" = "{role}"\n"node.id" = 9\n"cluster.id" = "c"\n{keys}')
    proc = subprocess.run([sys.executable, "-m", "broker.node", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert f"{held} is in use by another process (pid {ops_cluster.pid(1)}" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # The lock still names its holder, which still serves.
    assert (held / ".lock").read_text().strip() == str(ops_cluster.pid(1))
    status, body = ops_cluster.probe(1)
    assert status == 200, body


def test_a_broker_on_another_nodes_log_directory_refuses_to_start(tmp_path: Path) -> None:
    """The directory is free (its node is stopped) but belongs to node 1 of cluster c: node 9 refuses to
    start with one line and writes nothing there."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.properties").write_text("cluster.id=c\nnode.id=1\n")
    port = free_port()
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'"process.roles" = "broker"\n"node.id" = 9\n"cluster.id" = "c"\n'
                   f'"listeners" = "BROKER://127.0.0.1:{port}"\n"controller.quorum.voters" = "1@127.0.0.1:1:2"\n'
                   f'"log.dirs" = "{data}"\n')
    proc = subprocess.run([sys.executable, "-m", "broker.node", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert "node.id is '1', this node is configured with '9'" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in data.iterdir()) == [".lock", "meta.properties"]
    assert (data / "meta.properties").read_text() == "cluster.id=c\nnode.id=1\n"


def test_a_second_copy_of_a_running_node_refuses_to_start_on_its_lock(ops_cluster: LocalCluster) -> None:
    """The same config again (a forgotten process, a unit started twice): the directory lock refuses it with one
    line before anything is bound. The metrics port was bound first, so it failed on that port with a
    traceback instead (docs audit)."""
    proc = subprocess.run([sys.executable, "-m", "broker.node", "--config", str(ops_cluster.node_dir(1) / "node.toml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert f"is in use by another process (pid {ops_cluster.pid(1)}" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    status, body = ops_cluster.probe(1)
    assert status == 200, body

