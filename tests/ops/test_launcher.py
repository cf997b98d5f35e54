"""The background launcher: a cluster that passes `brook cluster health`, survives `stop` of one node
with the health report saying so, and comes back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_for

from admin_cli.main import main as brook_main
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow


def launcher(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.local", *args], capture_output=True, text=True,
                          timeout=180, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def health(capsys: pytest.CaptureFixture[str], bootstrap: str, security: list[str]) -> tuple[int, dict]:
    capsys.readouterr()
    code = brook_main(["-b", bootstrap, *security, "-o", "json", "--timeout", "5", "cluster", "health"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def wait_health(capsys: pytest.CaptureFixture[str], bootstrap: str, want_code: int, timeout_s: float,
                also: str = "", security: list[str] | None = None) -> dict:
    """``security``: CLI options for a secured cluster (the launcher's default: --command-config FILE)."""
    last: list[tuple[int, dict]] = []

    def healthy() -> dict | None:
        last.append(health(capsys, bootstrap, security or []))
        code, report = last[-1]
        return report if code == want_code and also in json.dumps(report) else None
    return wait_for(healthy, timeout_s, lambda: f"health to exit {want_code} with {also!r}; last: {last[-1:]}",
                    poll_s=0.5)


def wait_voter_disconnected(cluster: LocalCluster, voter: int, timeout_s: float) -> None:
    """The active controller's /metrics says the stopped voter is not connected."""
    pages: list[str] = []

    def reported() -> bool:
        pages[:] = [cluster.read_metrics(n) for n in cluster.node_ids if cluster.is_running(n)]
        return any(f'brook_raft_voter_connected{{voter="{voter}"}} 0.0' in p for p in pages)
    wait_for(reported, timeout_s, lambda: f"a controller to report voter {voter} disconnected; they say "
             f"{[ln for p in pages for ln in p.splitlines() if 'voter_connected{' in ln]}", poll_s=0.5)


def test_launcher_start_stop_one_node_and_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "cluster"
    try:
        # A short session timeout: the stopped broker is fenced (and reported) within seconds.
        proc = launcher("start", "--dir", str(base), "--nodes", "3", "--timeout", "90",
                        "--override", "broker.session.timeout.ms=3000")
        assert proc.returncode == 0 and "ready" in proc.stdout, proc
        cluster = LocalCluster.open(base)
        assert cluster.tls  # the launcher's default: mTLS, clients use the files it wrote
        sec = ["--command-config", str(base / "client.properties")]
        bootstrap = cluster.bootstrap_servers
        assert bootstrap in proc.stdout
        report = wait_health(capsys, bootstrap, 0, 30, security=sec)
        assert all(c["ok"] for c in report["checks"])

        capsys.readouterr()
        assert brook_main(["-b", bootstrap, *sec, "topic", "create", "replicated", "-p", "3", "-r", "3"]) == 0

        proc = launcher("status", "--dir", str(base))
        assert proc.returncode == 0 and proc.stdout.count("running") == 3, proc

        proc = launcher("stop", "--dir", str(base), "--node", "3")
        assert proc.returncode == 0, proc
        assert not cluster.is_running(3)
        report = wait_health(capsys, bootstrap, 1, 45, also="broker 3", security=sec)
        failed = {c["name"]: c["detail"] for c in report["checks"] if not c["ok"]}
        assert "broker 3" in failed.get("fenced brokers", ""), failed
        assert "under-replicated partitions" in failed, failed
        assert "voter 3" in failed.get("quorum", ""), failed

        proc = launcher("status", "--dir", str(base))
        assert proc.returncode == 1 and "stopped" in proc.stdout, proc
        wait_voter_disconnected(cluster, 3, 30)

        # A layout for an existing DIR is not taken, and the launcher says so (it was dropped without a word).
        proc = launcher("start", "--dir", str(base), "--node", "3", "--timeout", "90", "--nodes", "5", "--plaintext")
        assert proc.returncode == 0, proc
        assert "holds a cluster already (3 brokers, combined, mTLS): --nodes 5, --plaintext ignored" in proc.stderr, proc
        wait_health(capsys, bootstrap, 0, 60, security=sec)

        proc = launcher("stop", "--dir", str(base))
        assert proc.returncode == 0, proc
        assert not any(cluster.is_running(i) for i in cluster.node_ids)
        log = cluster.node_log(1).read_text()
        assert "controlled shutdown" in log and "node 1 stopped" in log, log[-2000:]
    finally:
        if (base / "cluster.json").exists():
            LocalCluster.open(base).teardown()


def test_launcher_errors_are_one_line(tmp_path: Path) -> None:
    proc = launcher("status", "--dir", str(tmp_path / "none"))
    assert proc.returncode == 1 and "no local cluster" in proc.stderr, proc
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    proc = launcher("start", "--dir", str(tmp_path), "--mode", "ring")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc


def test_split_mode_cluster_is_healthy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LocalCluster(tmp_path / "split", nodes=2, mode="split") as cluster:
        assert cluster.controller_ids == [1001, 1002, 1003] and cluster.broker_ids == [1, 2]
        assert len(cluster.bootstrap_servers.split(",")) == 2
        report = wait_health(capsys, cluster.bootstrap_servers, 0, 30)
        assert "leader 100" in json.dumps(report), report  # the quorum is the dedicated controllers
        controller_page = cluster.read_metrics(1001)
        assert "brook_raft_term" in controller_page and "brook_topic_messages_in_total" not in controller_page
    assert not any(cluster.is_running(i) for i in cluster.node_ids)


def test_nodes_do_not_outlive_a_killed_test_process(tmp_path: Path) -> None:
    """A LocalCluster owner that dies by SIGKILL (a crashed test run) leaves no orphan nodes."""
    import os
    import signal

    script = ("import sys, time\nfrom deploy.local.cluster import LocalCluster\n"
              f"c = LocalCluster({str(tmp_path / 'orphan')!r}, nodes=1)\nc.start()\nc.wait_ready(60)\n"
              "print(c.pid(1), flush=True)\ntime.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    node_pid = None
    try:
        assert owner.stdout is not None
        node_pid = int(owner.stdout.readline().strip())
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        def exited() -> bool:
            try:  # a zombie has exited; it only waits to be reaped by init
                return Path(f"/proc/{node_pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
            except FileNotFoundError:
                return True
        wait_for(exited, 30, f"node {node_pid} to exit with its owner (it outlived its owner)", poll_s=0.2)
    finally:
        if owner.poll() is None:
            owner.kill()
        if node_pid is not None and Path(f"/proc/{node_pid}").exists():
            os.kill(node_pid, signal.SIGKILL)
