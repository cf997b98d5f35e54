"""LocalQuorum: N controller-only processes on 127.0.0.1, for tests and the benchmark.

Each voter is a real ``python -m metadata_quorum.runner`` process with its own data
directory and log file, so faults are real: SIGKILL, SIGSTOP/SIGCONT, full restarts.
(Whole clusters with brokers come from ``deploy.local.cluster.LocalCluster``.)
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from metadata_quorum.client import ControllerClient
from metadata_quorum.node import VoterAddress
from metadata_quorum.runner import PASSWORD_ENV
from proto import controller_pb2 as pb
from proto import errors

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def _free_port() -> int:
    from deploy.local.cluster import free_port  # the launcher's pick: outside the ephemeral range

    return free_port()


class LocalQuorum:
    def __init__(self, base_dir: Path, *, voters: int = 3, cluster_id: str = "local-quorum",
                 password: str | None = None, extra_args: list[str] | None = None) -> None:
        self.base_dir = Path(base_dir)
        self.cluster_id = cluster_id
        # A fresh strong password per quorum: voters refuse weak ones (the Raft port runs pickles).
        self.password = password or secrets.token_urlsafe(32)
        self.extra_args = list(extra_args or [])
        self.voters = {i: VoterAddress("127.0.0.1", _free_port(), _free_port()) for i in range(1, voters + 1)}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.paused: set[int] = set()

    @property
    def voters_text(self) -> str:
        return ",".join(f"{i}@{v.host}:{v.grpc_port}:{v.raft_port}" for i, v in self.voters.items())

    @property
    def endpoints(self) -> list[tuple[str, int]]:
        return [(v.host, v.grpc_port) for v in self.voters.values()]

    def endpoint(self, node_id: int) -> tuple[str, int]:
        v = self.voters[node_id]
        return (v.host, v.grpc_port)

    def data_dir(self, node_id: int) -> Path:
        return self.base_dir / f"controller-{node_id}"

    def log_path(self, node_id: int) -> Path:
        return self.base_dir / f"controller-{node_id}.log"

    # ---- processes ----
    def start(self) -> None:
        for node_id in self.voters:
            self.start_node(node_id, wait=False)
        for node_id in self.voters:
            self._wait_ready(node_id)

    def start_node(self, node_id: int, *, wait: bool = True) -> None:
        if node_id in self.procs and self.procs[node_id].poll() is None:
            raise errors.InvalidRequestError(f"controller {node_id} is already running")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "metadata_quorum.runner", "--node-id", str(node_id), "--voters",
               self.voters_text, "--data-dir", str(self.data_dir(node_id)), "--cluster-id", self.cluster_id,
               *self.extra_args]
        logfile = open(self.log_path(node_id), "ab")  # noqa: SIM115 - owned by the child from here on
        repo_root = Path(__file__).resolve().parent.parent
        env = dict(os.environ, PYTHONPATH=str(repo_root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env[PASSWORD_ENV] = self.password  # not on the command line (ps shows it to every local user)
        self.procs[node_id] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logfile, env=env,
                                               cwd=str(repo_root))
        logfile.close()
        self.paused.discard(node_id)
        if wait:
            self._wait_ready(node_id)

    def _wait_ready(self, node_id: int) -> None:
        proc = self.procs[node_id]
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the runner prints READY once bound (or exits)
        if b"READY" not in line:
            proc.wait(timeout=READY_TIMEOUT_S)
            raise errors.KafkaStorageError(
                f"controller {node_id} did not start (exit {proc.returncode}); log: {self.log_tail(node_id)}")

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[node_id]
        if node_id in self.paused:
            proc.send_signal(signal.SIGCONT)
            self.paused.discard(node_id)
        proc.send_signal(sig)
        proc.wait(timeout=STOP_TIMEOUT_S)

    def stop_node(self, node_id: int) -> None:
        proc = self.procs.get(node_id)
        if proc is None or proc.poll() is not None:
            return
        if node_id in self.paused:
            proc.send_signal(signal.SIGCONT)
            self.paused.discard(node_id)
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)

    def pause(self, node_id: int) -> None:
        """SIGSTOP, returning once every thread of the voter has stopped (see deploy.local.processes)."""
        from deploy.local.processes import stop_process
        stop_process(self.procs[node_id].pid)
        self.paused.add(node_id)

    def resume(self, node_id: int) -> None:
        self.procs[node_id].send_signal(signal.SIGCONT)
        self.paused.discard(node_id)

    def stop(self) -> None:
        for node_id in list(self.procs):
            self.stop_node(node_id)
        for proc in self.procs.values():
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> LocalQuorum:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path(node_id).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ---- quorum queries ----
    def client(self, timeout_s: float = 15.0) -> ControllerClient:
        return ControllerClient(self.endpoints, timeout_s=timeout_s)

    def active_id(self, timeout_s: float = 20.0, *, exclude: set[int] | None = None) -> int:
        """The node id of the active controller (polling each live voter's DescribeQuorum)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node_id in self.voters:
                if node_id in (exclude or set()) or node_id in self.paused:
                    continue
                if self.procs.get(node_id) is None or self.procs[node_id].poll() is not None:
                    continue
                with ControllerClient([self.endpoint(node_id)], timeout_s=1.0) as c:
                    try:
                        r = c.call_endpoint(self.endpoint(node_id), "DescribeQuorum", pb.DescribeQuorumRequest(),
                                            timeout_s=1.0)
                    except grpc.RpcError:  # a voter that is down or starting: ask the next
                        continue
                    if r.error_code == 0:
                        return node_id
            time.sleep(0.05)
        raise errors.RequestTimedOutError(f"no active controller within {timeout_s}s")
