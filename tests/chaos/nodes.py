"""The chaos harness's cluster: 3 combined ``brook-server`` nodes, each in its network namespace.

``controllers=N`` makes a split-mode cluster instead: ``nodes`` broker-only nodes (ids 1..nodes) and N
controller-only voters (ids nodes+1..nodes+N), every one a process in a namespace of its own, so a cut can
separate a broker from one controller, or a controller from the brokers, while the rest still talk.

deploy.local.cluster.LocalCluster binds every node to 127.0.0.1; here a node binds the
address of its own namespace and is started through ``ip netns exec``, so the network
between nodes can be cut. Configs use LocalCluster's dev defaults (fast fencing) and are
secured as a production cluster must be off loopback: mTLS on every listener with node
certificates from a CA made for the run (broker-only requests need them), and a random
quorum password (the quorum ports are reachable beyond loopback).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from client.security import SecurityConfig
from deploy.local.certs import CertificateAuthority
from deploy.local.cluster import LOCAL_DEFAULTS, PARENT_PID_ENV, check_health, free_port
from deploy.local.processes import stop_process
from tests.chaos.netns import LoopbackNetwork, NamespaceNetwork

log = logging.getLogger(__name__)

_EXIT_WAIT_S = 10.0
_POLL_S = 0.2


@dataclass(frozen=True)
class NodeAddr:
    node_id: int
    host: str
    broker_port: int
    controller_port: int
    raft_port: int
    metrics_port: int
    replication_port: int  # the followers' listener (REPLICATION, broker/replication_listener.py)

    @property
    def broker(self) -> str:
        return f"{self.host}:{self.broker_port}"

    @property
    def controller(self) -> str:
        return f"{self.host}:{self.controller_port}"


class ChaosCluster:
    def __init__(self, base_dir: Path, network: NamespaceNetwork | LoopbackNetwork, nodes: int = 3,
                 overrides: dict[str, str] | None = None, controllers: int = 0) -> None:
        self.base_dir = base_dir
        self.network = network
        self.cluster_id = f"brook-chaos-{uuid.uuid4().hex[:8]}"
        self.overrides = dict(overrides or {})
        self.addrs: dict[int, NodeAddr] = {}
        # node id -> process.roles: combined nodes, or brokers 1..nodes and controller voters after them.
        self.roles: dict[int, str] = {n: "controller,broker" if not controllers else "broker"
                                      for n in range(1, nodes + 1)}
        self.roles.update({n: "controller" for n in range(nodes + 1, nodes + controllers + 1)})
        for node_id in self.roles:
            host = network.node_ip(node_id)
            if isinstance(network, NamespaceNetwork):
                # A namespace per node: the same well-known ports on every address.
                ports = (9092, 9093, 9094, 9100, 9096)
            else:
                ports = (free_port(), free_port(), free_port(), free_port(), free_port())
            self.addrs[node_id] = NodeAddr(node_id, host, *ports)
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self.paused: set[int] = set()
        self.quorum_password = secrets.token_urlsafe(24)
        self.tls_dir = base_dir / "tls"
        ca = CertificateAuthority.load_or_create(self.tls_dir)
        for node_id, a in self.addrs.items():
            ca.issue(self.tls_dir, f"node-{node_id}", hosts=(a.host, "localhost"))
        self.client_cert = ca.issue(self.tls_dir, "chaos-client", hosts=(), server=False)

    @property
    def client_config(self) -> dict[str, str]:
        """Client security settings (Producer/Consumer/Admin keyword arguments) for this cluster."""
        c = self.client_cert
        return {"security_protocol": "SSL", "ssl_ca_location": str(c.ca),
                "ssl_certificate_location": str(c.cert), "ssl_key_location": str(c.key)}

    @property
    def node_ids(self) -> list[int]:
        return sorted(self.addrs)

    @property
    def broker_ids(self) -> list[int]:
        return [n for n in self.node_ids if "broker" in self.roles[n]]

    @property
    def controller_ids(self) -> list[int]:
        return [n for n in self.node_ids if "controller" in self.roles[n]]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(self.addrs[n].broker for n in self.broker_ids)

    def node_dir(self, node_id: int) -> Path:
        return self.base_dir / f"node-{node_id}"

    def data_dir(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "data"

    def _write_config(self, node_id: int) -> Path:
        a = self.addrs[node_id]
        d = self.node_dir(node_id)
        d.mkdir(parents=True, exist_ok=True)
        voters = ",".join(f"{x.node_id}@{x.host}:{x.controller_port}:{x.raft_port}"
                          for x in self.addrs.values() if x.node_id in self.controller_ids)
        roles = self.roles[node_id]
        listeners = [f"BROKER://{a.broker}"] if "broker" in roles else []
        listeners += [f"CONTROLLER://{a.controller}"] if "controller" in roles else []
        listeners += [f"REPLICATION://{a.host}:{a.replication_port}"] if "broker" in roles else []
        keys: dict[str, str | int] = {
            "process.roles": roles,
            "node.id": node_id,
            "cluster.id": self.cluster_id,
            "listeners": ",".join(listeners),
            "controller.quorum.voters": voters,
            "metrics.listener": f"{a.host}:{a.metrics_port}",
            **({"log.dirs": str(self.data_dir(node_id))} if "broker" in roles else {}),
            **({"metadata.log.dir": str(d / "meta"), "controller.quorum.password": self.quorum_password}
               if "controller" in roles else {}),
            **LOCAL_DEFAULTS,
            "offsets.topic.replication.factor": "3",
            "listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL,REPLICATION:SSL",
            "ssl.certificate.location": str(self.tls_dir / f"node-{node_id}.pem"),
            "ssl.key.location": str(self.tls_dir / f"node-{node_id}.key"),
            "ssl.ca.location": str(self.tls_dir / "ca.pem"),
            "ssl.client.auth": "required",
            "security.plaintext.loopback.trusted": "false",
            **self.overrides,
        }
        path = d / "node.toml"
        path.write_text("".join(f"{json.dumps(k)} = {json.dumps(v) if isinstance(v, str) else v}\n"
                                for k, v in keys.items()))
        return path

    # ---- processes
    def start(self) -> None:
        for node_id in self.node_ids:
            self.start_node(node_id)

    def start_node(self, node_id: int) -> None:
        if self.is_running(node_id):
            return
        config = self._write_config(node_id)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
        env["PYTHONUNBUFFERED"] = "1"
        env[PARENT_PID_ENV] = str(os.getpid())  # nodes stop themselves if the harness dies
        with (self.node_dir(node_id) / "server.log").open("ab") as logf:
            # `ip netns exec` execs the command: the Popen pid is the node itself, so signals reach it.
            proc = subprocess.Popen(
                [*self.network.command_prefix(node_id), sys.executable, "-m", "broker.node", "--config", str(config)],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                cwd=str(self.node_dir(node_id)), start_new_session=True)
        self._procs[node_id] = proc
        self.paused.discard(node_id)
        log.info("node %d started (pid %d)", node_id, proc.pid)

    def is_running(self, node_id: int) -> bool:
        proc = self._procs.get(node_id)
        return proc is not None and proc.poll() is None

    def kill(self, node_id: int) -> None:
        proc = self._procs.get(node_id)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_EXIT_WAIT_S)
        self.paused.discard(node_id)

    def pause(self, node_id: int) -> None:
        proc = self._procs.get(node_id)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                stop_process(proc.pid)  # returns once every thread has stopped
            self.paused.add(node_id)

    def resume(self, node_id: int) -> None:
        proc = self._procs.get(node_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self.paused.discard(node_id)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Controlled stop of every node (SIGTERM), SIGKILL for any still alive at the deadline."""
        for node_id in list(self.paused):
            self.resume(node_id)
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node_id, proc in self._procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("node %d did not stop within %.0f s: SIGKILL", node_id, timeout_s)
                self.kill(node_id)

    def teardown(self) -> None:
        for node_id in self.node_ids:
            if node_id in self.paused:
                self.resume(node_id)
            self.kill(node_id)

    def unexpected_exits(self) -> dict[int, int]:
        """Nodes that exited although the nemesis did not kill them: {node: exit code}."""
        return {n: p.returncode for n, p in self._procs.items() if p.poll() is not None}

    # ---- status
    def all_serving(self) -> bool:
        for a in self.addrs.values():
            if not self.is_running(a.node_id):
                return False
            roles = self.roles[a.node_id]
            for target in [a.broker] * ("broker" in roles) + [a.controller] * ("controller" in roles):
                if check_health(target, security=SecurityConfig.from_config(self.client_config)) != "SERVING":
                    return False
        return True

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        try:
            text = (self.node_dir(node_id) / "server.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
