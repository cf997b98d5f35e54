"""LocalCluster: a real multi-process Brook cluster on 127.0.0.1, for tests, demos and dev.

Every node is a real ``brook-server`` subprocess with its own config, data and log
under ``base_dir/node-<id>/``. Ports are chosen free at first start and kept (in
``base_dir/cluster.json``) so a restarted node comes back on the same addresses.

Modes:
- ``combined``: ``nodes`` nodes, ids 1..N, each ``controller,broker``;
- ``split``: ``nodes`` brokers (ids 1..N) plus ``controllers`` (default 3, or 1 for a
  single broker) controller-only nodes with ids 1001, 1002, ...

Broker ids are 1..N in both modes, so ``kill_node(2)`` means "broker 2" everywhere.

Security: ``tls=True`` makes a CA under ``base_dir/tls`` (deploy/local/certs.py), a
certificate per node (``CN=node-<id>``: the node's broker principal) and a client
certificate (``CN=admin``); every gRPC listener (BROKER, CONTROLLER) is then mTLS,
plaintext broker-only requests are refused even on loopback, and /metrics is HTTPS.
``client_config`` / ``security`` give clients what they need, also written as
``base_dir/client.properties`` and ``base_dir/env.sh`` (``export BROOK_...``). The
launcher (``python -m deploy.local start``) and ``make demo`` turn it on by default;
the class defaults to plaintext, which the test suite's in-process helpers use.

    with LocalCluster(tmp_path, nodes=3) as cluster:   # start + wait_ready
        cluster.bootstrap_servers                      # "127.0.0.1:p1,127.0.0.1:p2,..."
        cluster.kill_node(2)                           # SIGKILL
        cluster.restart_node(2)

Processes are started in their own session (a Ctrl-C in the caller's terminal does not
reach them). Unless ``detach=True`` (the background launcher), each node is told its
parent's pid (``BROOK_LOCAL_PARENT_PID``) and shuts itself down when that process is
gone: no orphans after a crashed test run.

Fault injection (tests): ``launch_prefixes={2: ["fiu-run", "-x"]}`` starts node 2 as
``fiu-run -x python -m broker.node ...`` (each start and restart of it, until the entry is
removed from ``cluster.launch_prefixes``); no node has one by default, and it is not saved in
cluster.json. The prefix must ``exec`` the node (as fiu-run, nice, taskset, prlimit and env
do), so that the pid started is the node's own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.security import SecurityConfig, env_var, make_channel
from deploy.local.processes import stop_process
from proto import controller_pb2, controller_pb2_grpc, errors

if TYPE_CHECKING:
    from deploy.local.certs import CertFiles

log = logging.getLogger(__name__)

STATE_FILE = "cluster.json"
QUORUM_PASSWORD_FILE = "quorum.password"  # random per cluster, 0600: the quorum port runs pickles
TLS_DIR = "tls"
CLIENT_CERT_NAME = "admin"  # the client certificate's CN: principal User:admin
KAFKA_CLIENT_PROPERTIES = "kafka-client.properties"
CLIENT_PROPERTIES = "client.properties"
DEMO_USER = "demo"  # the least-privileged demo principal (User:demo, certificate DIR/tls/demo.pem)
DEMO_PREFIX = "demo-"  # the topics and groups it may use
ENV_FILE = "env.sh"
PARENT_PID_ENV = "BROOK_LOCAL_PARENT_PID"  # read by broker/node.py
CONTROLLER_ID_BASE = 1000
DEFAULT_CONTROLLERS = 3
STOP_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.2
RPC_TIMEOUT_S = 2.0
# Dev-friendly defaults a local cluster starts with (callers' overrides win): quick
# first rebalance, a small offsets topic, fast failure detection.
LOCAL_DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "10000",
    "log.retention.check.interval.ms": "5000",
    "controlled.shutdown.timeout.ms": "15000",
}


class ClusterError(RuntimeError):
    """A local cluster could not be started, found, or brought to the asked state."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_PORT_ATTEMPTS_MAX = 200
_GIVEN_PORTS_MAX = 5000
_given_ports: set[int] = set()  # never hand out the same port twice in one process (nodes bind later)


PORT_RANGE_ENV = "BROOK_LOCAL_PORT_RANGE"


def _port_range() -> tuple[int, int]:
    """Where ``free_port`` picks: ``BROOK_LOCAL_PORT_RANGE`` (``LOW-HIGH``) when set, so processes that
    start clusters side by side (the test suite's workers) never pick the same free port; else
    from 15000 to just below the kernel's ephemeral range. A range that overlaps the ephemeral one is
    refused: a port found free there can be taken by an outgoing connection before the node binds it,
    and the cluster then fails to start now and then (seen with 40000-47999)."""
    text = os.environ.get(PORT_RANGE_ENV, "")
    if text:
        try:
            lo, hi = (int(x) for x in text.split("-"))
        except ValueError:
            raise ClusterError(f"{PORT_RANGE_ENV}={text!r}: expected LOW-HIGH, e.g. 15000-23999") from None
        if not 1024 <= lo < hi <= 65535:
            raise ClusterError(f"{PORT_RANGE_ENV}={text!r}: expected 1024 <= LOW < HIGH <= 65535")
        e_lo, e_hi = _ephemeral_range()
        if lo <= e_hi and e_lo <= hi:
            raise ClusterError(f"{PORT_RANGE_ENV}={text!r} overlaps the kernel's ephemeral port range {e_lo}-{e_hi} "
                               "(/proc/sys/net/ipv4/ip_local_port_range), which outgoing connections draw from: "
                               "pick ports below or above it")
        return lo, hi
    low, _ = _ephemeral_range()
    return 15000, max(15001, low - 1)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, picked *below* the kernel's ephemeral range.

    Ports the kernel hands out (bind to 0) are the same pool outgoing connections draw their
    local ports from, so one could be taken by a client socket in the second before the node
    binds it. Picking at random from below that range and checking with a bind avoids both.
    """
    lo, hi = _port_range()
    for _ in range(_PORT_ATTEMPTS_MAX):
        port = random.randint(lo, hi)
        if port in _given_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        if len(_given_ports) >= _GIVEN_PORTS_MAX:
            _given_ports.clear()
        _given_ports.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded machine: let the kernel pick
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class NodeSpec:
    """What a node is and where it listens; persisted in cluster.json."""

    node_id: int
    roles: list[str]
    broker_port: int | None
    controller_port: int | None
    raft_port: int | None
    metrics_port: int
    health_port: int | None = None  # plain-HTTP /livez, /readyz (cluster.json of older launchers: none)
    console_port: int | None = None  # brokers: the read-only web console
    kafka_port: int | None = None  # brokers: the Kafka-protocol listener (KAFKA), for unmodified Kafka clients
    replication_port: int | None = None  # brokers: the followers' listener (REPLICATION)

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles


@dataclass
class ClusterState:
    mode: str
    cluster_id: str
    nodes: list[NodeSpec]
    overrides: dict[str, str] = field(default_factory=dict)
    tls: bool = False
    authorizer: bool = False
    # node id (as text: JSON's keys) -> keys of that node's config only, over ``overrides`` (broker.rack, ...)
    node_overrides: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        data = json.loads(path.read_text())
        return cls(mode=data["mode"], cluster_id=data["cluster_id"], overrides=data.get("overrides", {}),
                   nodes=[NodeSpec(**n) for n in data["nodes"]], tls=bool(data.get("tls", False)),
                   authorizer=bool(data.get("authorizer", False)),
                   node_overrides=data.get("node_overrides", {}))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)


def rss_bytes(pid: int | None) -> int | None:
    """Resident memory of process ``pid`` (VmRSS, Linux /proc); None when it cannot be read."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _pid_is_brook_server(pid: int) -> bool:
    """True if ``pid`` runs brook-server (guards against pid reuse in pid files)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state != "Z" and b"broker.node" in cmdline


class LocalCluster:
    def __init__(
        self,
        base_dir: str | Path,
        nodes: int = 3,
        mode: str = "combined",
        overrides: Mapping[str, str] | None = None,
        *,
        controllers: int | None = None,
        cluster_id: str | None = None,
        detach: bool = False,
        python: str | None = None,
        tls: bool = False,
        authorizer: bool = False,
        launch_prefixes: Mapping[int, Sequence[str]] | None = None,
    ) -> None:
        if mode not in ("combined", "split"):
            raise ValueError(f"mode must be combined or split, not {mode!r}")
        if nodes < 1:
            raise ValueError("nodes must be at least 1")
        self.base_dir = Path(base_dir).resolve()
        self.mode = mode
        self.detach = detach
        self.python = python or sys.executable
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._paused: set[int] = set()
        # node id -> the command its process is started under (see the module docstring)
        self.launch_prefixes: dict[int, list[str]] = {k: list(v) for k, v in (launch_prefixes or {}).items()}
        state_path = self.base_dir / STATE_FILE
        if state_path.exists():
            # An existing cluster directory: same ids and ports (so data and quorum stay valid).
            self.state = ClusterState.load(state_path)
            if overrides:
                self.state.overrides.update({k: str(v) for k, v in overrides.items()})
            self.mode = self.state.mode
        else:
            n_ctl = controllers if controllers is not None else (1 if nodes == 1 else DEFAULT_CONTROLLERS)
            # A fresh id per cluster: a node of another local cluster that reaches a reused
            # port is refused by cluster.id instead of joining (seen with parallel test runs).
            cluster_id = cluster_id or f"brook-local-{uuid.uuid4().hex[:8]}"
            self.state = ClusterState(mode=mode, cluster_id=cluster_id,
                                      overrides={k: str(v) for k, v in (overrides or {}).items()},
                                      nodes=self._plan(nodes, mode, n_ctl), tls=tls, authorizer=authorizer)
        if self.state.authorizer and not self.state.tls:
            raise ClusterError("the authorizer needs TLS here: principals come from client certificates")

    @classmethod
    def open(cls, base_dir: str | Path, **kwargs: Any) -> LocalCluster:
        """An existing cluster directory (made by start()); raises ClusterError if there is none."""
        if not (Path(base_dir) / STATE_FILE).exists():
            raise ClusterError(f"no local cluster in {base_dir} (no {STATE_FILE}); start one first")
        return cls(base_dir, **kwargs)

    # ------------------------------------------------------------------ layout

    @staticmethod
    def _plan(nodes: int, mode: str, controllers: int) -> list[NodeSpec]:
        specs: list[NodeSpec] = []
        if mode == "combined":
            for i in range(1, nodes + 1):
                specs.append(NodeSpec(i, ["controller", "broker"], free_port(), free_port(), free_port(),
                                      free_port(), free_port(), free_port(), kafka_port=free_port(),
                                      replication_port=free_port()))
            return specs
        for i in range(1, controllers + 1):
            specs.append(NodeSpec(CONTROLLER_ID_BASE + i, ["controller"], None, free_port(), free_port(),
                                  free_port(), free_port()))
        for i in range(1, nodes + 1):
            specs.append(NodeSpec(i, ["broker"], free_port(), None, None, free_port(), free_port(), free_port(),
                                  kafka_port=free_port(), replication_port=free_port()))
        return specs

    @property
    def node_ids(self) -> list[int]:
        return [n.node_id for n in self.state.nodes]

    @property
    def broker_ids(self) -> list[int]:
        return [n.node_id for n in self.state.nodes if n.is_broker]

    @property
    def controller_ids(self) -> list[int]:
        return [n.node_id for n in self.state.nodes if n.is_controller]

    def spec(self, node_id: int) -> NodeSpec:
        for n in self.state.nodes:
            if n.node_id == node_id:
                return n
        raise ClusterError(f"no node {node_id} in this cluster (nodes: {self.node_ids})")

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.broker_port}" for n in self.state.nodes if n.is_broker)

    @property
    def kafka_bootstrap_servers(self) -> str:
        """The brokers' Kafka-protocol listeners (KAFKA), for Kafka clients (librdkafka, kcat, kafka-python)."""
        return ",".join(self.kafka_address(n.node_id) for n in self.state.nodes if n.is_broker and n.kafka_port)

    def kafka_address(self, node_id: int) -> str:
        port = self.spec(node_id).kafka_port
        if not port:
            raise ClusterError(f"node {node_id} has no Kafka listener (a broker of an older launcher's cluster)")
        return f"127.0.0.1:{port}"

    def kafka_client_config(self, name: str = "admin") -> dict[str, str]:
        """librdkafka-style settings for the Kafka listener: bootstrap.servers, and on TLS clusters mTLS with the
        certificate ``DIR/tls/<name>.pem`` (User:<name>)."""
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **self.client_config_for(name)}

    @property
    def controller_endpoints(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", int(n.controller_port)) for n in self.state.nodes if n.is_controller]

    def broker_address(self, node_id: int) -> str:
        return f"127.0.0.1:{self.spec(node_id).broker_port}"

    def metrics_url(self, node_id: int) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.spec(node_id).metrics_port}/metrics"

    def probe(self, node_id: int, path: str = "/readyz", timeout_s: float = 5.0) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of a node's health listener (/livez or /readyz)."""
        import urllib.error
        import urllib.request

        port = self.spec(node_id).health_port
        if not port:
            raise ClusterError(f"node {node_id} has no health listener (cluster made by an older launcher)")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def console_url(self, node_id: int) -> str:
        """The broker's web console (https with the cluster's TLS: the browser needs a client certificate)."""
        port = self.spec(node_id).console_port
        if not port:
            raise ClusterError(f"node {node_id} serves no console")
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}/"

    def read_metrics(self, node_id: int, timeout_s: float = 5.0) -> str:
        """A node's /metrics page (over HTTPS with the cluster's CA and client certificate when TLS)."""
        import ssl
        import urllib.request

        context = None
        if self.tls:
            c = self.client_cert()
            context = ssl.create_default_context(cafile=str(c.ca))
            context.load_cert_chain(str(c.cert), str(c.key))
        with urllib.request.urlopen(self.metrics_url(node_id), timeout=timeout_s, context=context) as resp:
            return resp.read().decode()

    def metric(self, node_id: int, name: str, **labels: str) -> float:
        """The value of sample ``name`` with exactly ``labels`` on a node's /metrics page; 0 when it has none (a
        counter not yet incremented)."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.read_metrics(node_id)):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0

    # ------------------------------------------------------------------ security

    @property
    def tls(self) -> bool:
        return self.state.tls

    @property
    def tls_dir(self) -> Path:
        return self.base_dir / TLS_DIR

    def node_cert(self, node_id: int) -> CertFiles:
        from deploy.local.certs import CertFiles

        d = self.tls_dir
        return CertFiles(d / f"node-{node_id}.pem", d / f"node-{node_id}.key", d / "ca.pem")

    def client_cert(self) -> CertFiles:
        from deploy.local.certs import CertFiles

        d = self.tls_dir
        return CertFiles(d / f"{CLIENT_CERT_NAME}.pem", d / f"{CLIENT_CERT_NAME}.key", d / "ca.pem")

    @property
    def client_config(self) -> dict[str, str]:
        """Kafka-named client security configs for this cluster (empty when plaintext): the operator's
        ``admin`` certificate (User:admin, a super user when the authorizer is on)."""
        return self.client_config_for(CLIENT_CERT_NAME)

    def client_config_for(self, name: str) -> dict[str, str]:
        """Client security configs with the certificate ``DIR/tls/<name>.pem`` (principal User:<name>)."""
        if not self.tls:
            return {}
        d = self.tls_dir
        return {"security.protocol": "SSL", "ssl.ca.location": str(d / "ca.pem"),
                "ssl.certificate.location": str(d / f"{name}.pem"), "ssl.key.location": str(d / f"{name}.key")}

    @property
    def authorizer(self) -> bool:
        return self.state.authorizer

    def grant_demo_acls(self, timeout_s: float = 60.0) -> None:
        """Least privilege for the demo principal (User:demo): topics and groups named ``demo-*``
        only. Idempotent (ACLs are a set), so every start may call it."""
        if not self.authorizer:
            return
        from client.admin import Admin
        from metadata_quorum.security import acl_binding

        grants = [["TOPIC", DEMO_PREFIX, "PREFIXED", f"User:{DEMO_USER}", "*", op, "ALLOW"]
                  for op in ("CREATE", "WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS")]
        grants.append(["GROUP", DEMO_PREFIX, "PREFIXED", f"User:{DEMO_USER}", "*", "READ", "ALLOW"])
        deadline = time.monotonic() + timeout_s
        with Admin(self.bootstrap_servers, request_timeout_ms=int(timeout_s * 1000),
                   controller_endpoints=self.controller_endpoints, security=self.security) as admin:
            while True:
                try:
                    admin.create_acls([acl_binding(g) for g in grants])
                    return
                except errors.BrookError as e:
                    if not e.retriable or time.monotonic() > deadline:
                        raise ClusterError(f"granting the demo user's ACLs failed: {e}") from None
                    time.sleep(0.5)

    @property
    def security(self) -> SecurityConfig:
        return SecurityConfig.from_config(self.client_config)

    def _ensure_certificates(self) -> None:
        """CA, node and client certificates under base_dir/tls (made once, kept across restarts)."""
        # Imported here so `python -m deploy.local.certs` does not find itself half-imported.
        from deploy.local.certs import CertificateAuthority

        ca = CertificateAuthority.load_or_create(self.tls_dir)
        for n in self.state.nodes:
            if not self.node_cert(n.node_id).cert.exists():
                ca.issue(self.tls_dir, f"node-{n.node_id}", hosts=("localhost", "127.0.0.1"))
        if not self.client_cert().cert.exists():
            ca.issue(self.tls_dir, CLIENT_CERT_NAME, hosts=(), server=False)
        if self.authorizer and not (self.tls_dir / f"{DEMO_USER}.pem").exists():
            ca.issue(self.tls_dir, DEMO_USER, hosts=(), server=False)

    def _write_client_files(self) -> None:
        lines = ["# Client settings for this local cluster (brook --command-config FILE, or Kafka tools)."]
        lines += [f"bootstrap.servers={self.bootstrap_servers}"]
        lines += [f"{k}={v}" for k, v in self.client_config.items()]
        (self.base_dir / CLIENT_PROPERTIES).write_text("\n".join(lines) + "\n")
        if self.kafka_bootstrap_servers:  # librdkafka's format, for kcat -F and other Kafka tools
            kafka = ["# Kafka clients (the brokers' KAFKA listeners): kcat -F FILE -L"]
            kafka += [f"{k}={v}" for k, v in self.kafka_client_config().items()]
            (self.base_dir / KAFKA_CLIENT_PROPERTIES).write_text("\n".join(kafka) + "\n")
        exports = {"BROOK_BOOTSTRAP": self.bootstrap_servers}
        exports.update({env_var(k): v for k, v in self.client_config.items()})
        (self.base_dir / ENV_FILE).write_text(
            "# source this file: the brook CLI reads these variables\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in exports.items()))

    def _tls_keys(self, n: NodeSpec) -> dict[str, Any]:
        if not self.tls:
            return {}
        c = self.node_cert(n.node_id)
        return {
            "listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL",
            "ssl.certificate.location": str(c.cert),
            "ssl.key.location": str(c.key),
            "ssl.ca.location": str(c.ca),
            "ssl.client.auth": "required",
            # Every node talks mTLS: a plaintext caller is nobody, even on loopback.
            "security.plaintext.loopback.trusted": "false",
            "metrics.ssl.enable": "true",
            # /metrics names every topic and group: a client certificate, as on every other listener.
            "metrics.ssl.client.auth": "required",
            **({"authorizer.class.name": "StandardAuthorizer", "super.users": f"User:{CLIENT_CERT_NAME}",
                "allow.everyone.if.no.acl.found": "false"} if self.authorizer else {}),
        }

    def node_dir(self, node_id: int) -> Path:
        return self.base_dir / f"node-{node_id}"

    def node_log(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "server.log"

    def config_path(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "node.toml"

    def pid_path(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "server.pid"

    def _voters(self) -> str:
        return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}:{n.raft_port}"
                        for n in self.state.nodes if n.is_controller)

    def _quorum_password(self) -> str:
        """The cluster's quorum password: generated once, kept (0600) in the cluster directory."""
        path = self.base_dir / QUORUM_PASSWORD_FILE
        if not path.exists():
            self.base_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
        return path.read_text().strip()

    def _write_config(self, n: NodeSpec) -> Path:
        d = self.node_dir(n.node_id)
        d.mkdir(parents=True, exist_ok=True)
        listeners = []
        if n.is_broker:
            listeners.append(f"BROKER://127.0.0.1:{n.broker_port}")
        if n.is_controller:
            listeners.append(f"CONTROLLER://127.0.0.1:{n.controller_port}")
        if n.is_broker and n.kafka_port:
            listeners.append(f"KAFKA://127.0.0.1:{n.kafka_port}")
        if n.is_broker and n.replication_port:
            listeners.append(f"REPLICATION://127.0.0.1:{n.replication_port}")
        n_brokers = len(self.broker_ids)
        keys: dict[str, Any] = {
            "process.roles": ",".join(n.roles),
            "node.id": n.node_id,
            "cluster.id": self.state.cluster_id,
            "listeners": ",".join(listeners),
            "controller.quorum.voters": self._voters(),
            "metrics.listener": f"127.0.0.1:{n.metrics_port}",
            "health.listener": f"127.0.0.1:{n.health_port}" if n.health_port else "",
            "console.listener": f"127.0.0.1:{n.console_port}" if n.console_port and n.is_broker else "",
            **LOCAL_DEFAULTS,
            "offsets.topic.replication.factor": str(min(3, n_brokers)),
            "listener.security.protocol.map": "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
            **self._tls_keys(n),
        }
        if n.is_broker:
            keys["log.dirs"] = str(d / "data")
        if n.is_controller:
            keys["metadata.log.dir"] = str(d / "meta")
            keys["controller.quorum.password"] = self._quorum_password()
        keys.update(self.state.overrides)
        keys.update(self.state.node_overrides.get(str(n.node_id), {}))
        if n.is_broker and n.kafka_port and "KAFKA:" not in str(keys["listener.security.protocol.map"]):
            # The Kafka listener is as secure as the cluster: mTLS with the same CA on a TLS cluster.
            keys["listener.security.protocol.map"] += f",KAFKA:{'SSL' if self.tls else 'PLAINTEXT'}"
        if n.is_broker and n.replication_port and "REPLICATION:" not in str(keys["listener.security.protocol.map"]):
            # The followers' listener speaks BROKER's protocol (broker/config.py requires it).
            broker_protocol = "SSL" if "BROKER:SSL" in str(keys["listener.security.protocol.map"]) else "PLAINTEXT"
            keys["listener.security.protocol.map"] += f",REPLICATION:{broker_protocol}"
        lines = ["# Written by deploy.local.cluster.LocalCluster; edits are lost on the next start."]
        for k, v in keys.items():
            lines.append(f"{json.dumps(k)} = {_toml_value(v)}")
        path = self.config_path(n.node_id)
        # 0600: the config holds the quorum password (and SCRAM bootstrap users when overridden).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode on O_CREAT
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def save_state(self) -> None:
        """Persist cluster.json (after changing a node's addresses, e.g. to replace a lost voter)."""
        self.state.save(self.base_dir / STATE_FILE)

    # ------------------------------------------------------------------ processes

    def start(self) -> None:
        """Write configs and start every node that is not running (does not wait; see wait_ready)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.state.save(self.base_dir / STATE_FILE)
        if self.tls:
            self._ensure_certificates()
        self._write_client_files()
        for n in self._start_order():
            if not self.is_running(n.node_id):
                self.start_node(n.node_id)

    def _start_order(self) -> list[NodeSpec]:
        return sorted(self.state.nodes, key=lambda n: (not n.is_controller, n.node_id))

    def start_node(self, node_id: int) -> None:
        n = self.spec(node_id)
        if self.is_running(node_id):
            raise ClusterError(f"node {node_id} is already running (pid {self.pid(node_id)})")
        config = self._write_config(n)
        logf = self.node_log(node_id).open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for k in [k for k in env if k.startswith("BROOK_")]:
            del env[k]  # a stray BROOK_<KEY> in the caller's environment must not change the nodes
        if not self.detach:
            env[PARENT_PID_ENV] = str(os.getpid())
        try:
            proc = subprocess.Popen(
                [*self.launch_prefixes.get(node_id, ()), self.python, "-m", "broker.node", "--config", str(config)],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                cwd=str(self.node_dir(node_id)), start_new_session=True,
            )
        finally:
            logf.close()
        self._procs[node_id] = proc
        self._paused.discard(node_id)
        self.pid_path(node_id).write_text(f"{proc.pid}\n")
        log.info("started node %d (pid %d), log %s", node_id, proc.pid, self.node_log(node_id))

    def pid(self, node_id: int) -> int | None:
        proc = self._procs.get(node_id)
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        try:
            pid = int(self.pid_path(node_id).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_is_brook_server(pid) else None

    def is_running(self, node_id: int) -> bool:
        return self.pid(node_id) is not None

    def is_paused(self, node_id: int) -> bool:
        return node_id in self._paused

    def returncode(self, node_id: int) -> int | None:
        proc = self._procs.get(node_id)
        return None if proc is None else proc.poll()

    def _signal(self, node_id: int, sig: int) -> bool:
        pid = self.pid(node_id)
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        return True

    def _wait_exit(self, node_id: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        proc = self._procs.get(node_id)
        while time.monotonic() < deadline:
            if proc is not None:
                try:
                    proc.wait(timeout=POLL_INTERVAL_S)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not self.is_running(node_id):
                return True
            time.sleep(POLL_INTERVAL_S)
        return not self.is_running(node_id)

    def stop_node(self, node_id: int, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Controlled stop (SIGTERM); SIGKILL if it has not exited within timeout_s. Returns the exit code
        when this object started the process."""
        if node_id in self._paused:
            self.resume_node(node_id)
        if self._signal(node_id, signal.SIGTERM) and not self._wait_exit(node_id, timeout_s):
            log.warning("node %d did not stop within %.0f s: SIGKILL", node_id, timeout_s)
            self.kill_node(node_id)
        return self.returncode(node_id)

    def kill_node(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default: a crash); waits for the exit when it is SIGKILL."""
        self._signal(node_id, sig)
        if sig == signal.SIGKILL:
            self._wait_exit(node_id, 10.0)
            self._paused.discard(node_id)

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP: the process is alive but silent (a hung node, a GC pause, a partition). Returns once
        every thread of it has stopped (``kill`` alone returns while some still run)."""
        pid = self.pid(node_id)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            stop_process(pid)
        self._paused.add(node_id)

    def resume_node(self, node_id: int) -> None:
        if self._signal(node_id, signal.SIGCONT):
            self._paused.discard(node_id)

    def restart_node(self, node_id: int, *, controlled: bool = True, timeout_s: float = STOP_TIMEOUT_S) -> None:
        if self.is_running(node_id):
            if controlled:
                self.stop_node(node_id, timeout_s)
            else:
                self.kill_node(node_id)
        self.start_node(node_id)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Controlled stop of every node: brokers first (their shutdown needs the quorum), then
        controllers; anything still alive after timeout_s is killed."""
        for n in self.state.nodes:
            if n.node_id in self._paused:
                self.resume_node(n.node_id)
        brokers = [n.node_id for n in self.state.nodes if n.is_broker and not n.is_controller]
        combined = [n.node_id for n in self.state.nodes if n.is_broker and n.is_controller]
        controllers = [n.node_id for n in self.state.nodes if n.is_controller and not n.is_broker]
        for group in (brokers, combined, controllers):
            for node_id in group:  # signal the whole group first so they shut down in parallel
                self._signal(node_id, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for node_id in group:
                if not self._wait_exit(node_id, max(0.0, deadline - time.monotonic())):
                    log.warning("node %d did not stop within %.0f s: SIGKILL", node_id, timeout_s)
                    self.kill_node(node_id)

    def teardown(self) -> None:
        """Kill everything now (test cleanup)."""
        for node_id in self.node_ids:
            self.kill_node(node_id)

    close = stop

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.stop(timeout_s=20.0)
        self.teardown()

    # ------------------------------------------------------------------ readiness and status

    def health(self, node_id: int) -> dict[str, str]:
        """gRPC health of each listener of a running node: {"BROKER": "SERVING", ...}."""
        n = self.spec(node_id)
        out: dict[str, str] = {}
        for name, port in (("CONTROLLER", n.controller_port), ("BROKER", n.broker_port)):
            if port is None:
                continue
            out[name] = check_health(f"127.0.0.1:{port}", security=self.security)
        return out

    def describe_cluster(self, timeout_s: float = RPC_TIMEOUT_S) -> controller_pb2.DescribeClusterResponse:
        """DescribeCluster from the active controller (asks each controller until one answers)."""
        last = "no controller answered"
        for host, port in self.controller_endpoints:
            try:
                with make_channel(f"{host}:{port}", self._probe_security()) as ch:
                    resp = controller_pb2_grpc.ControllerServiceStub(ch).DescribeCluster(
                        controller_pb2.DescribeClusterRequest(), timeout=timeout_s)
            except grpc.RpcError as e:
                last = f"{host}:{port}: {e.code().name}"
                continue
            if resp.error_code == 0:
                return resp
            last = f"{host}:{port}: error {resp.error_code} {resp.error_message}"
        raise ClusterError(last)

    def _probe_security(self) -> SecurityConfig:
        """How the launcher calls the controllers: the admin certificate on a TLS cluster; with an
        authorizer on a plaintext one, DescribeCluster needs a principal: the nodes' inter-broker SCRAM user."""
        user = self.state.overrides.get("inter.broker.sasl.username", "")
        if self.security.uses_ssl or not user:
            return self.security
        return SecurityConfig(protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username=user,
                              sasl_password=self.state.overrides.get("inter.broker.sasl.password", ""))

    def not_ready_reason(self) -> str | None:
        """None when every node that should run is up, healthy, and every broker is registered
        and unfenced with the active controller; else what is missing."""
        for node_id in self.node_ids:
            if not self.is_running(node_id):
                code = self.returncode(node_id)
                return f"node {node_id} is not running" + (f" (exit code {code})" if code is not None else "")
            for listener, status in self.health(node_id).items():
                if status != "SERVING":
                    return f"node {node_id} {listener} health is {status}"
        try:
            desc = self.describe_cluster()
        except ClusterError as e:
            return f"no active controller: {e}"
        registered = {b.node_id: b for b in desc.brokers}
        for broker_id in self.broker_ids:
            b = registered.get(broker_id)
            if b is None:
                return f"broker {broker_id} is not registered"
            if b.fenced:
                return f"broker {broker_id} is fenced"
        return None

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll until ready (see not_ready_reason); raise ClusterError with the reason and the
        tail of the failing node's log at the deadline or when a node died."""
        deadline = time.monotonic() + timeout_s
        reason: str | None = "not checked"
        while time.monotonic() < deadline:
            reason = self.not_ready_reason()
            if reason is None:
                return
            dead = [i for i in self.node_ids if self.returncode(i) is not None]
            if dead:
                break
            time.sleep(POLL_INTERVAL_S)
        dead = [i for i in self.node_ids if not self.is_running(i)]
        tails = "".join(f"\n--- node {i} log tail ---\n{self.log_tail(i)}" for i in (dead or self.node_ids[:1]))
        raise ClusterError(f"cluster not ready after {timeout_s:.0f} s: {reason}{tails}")

    def wait_for(self, condition: Any, timeout_s: float = 30.0, what: str = "condition") -> Any:
        """Poll ``condition()`` until truthy; returns its value; ClusterError at the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(POLL_INTERVAL_S)
        raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    def log_tail(self, node_id: int, lines: int = 30) -> str:
        try:
            text = self.node_log(node_id).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def status(self) -> list[dict[str, Any]]:
        """One row per node: id, roles, pid, running, health per listener, addresses."""
        rows = []
        for n in self.state.nodes:
            pid = self.pid(n.node_id)
            running = pid is not None
            rows.append({
                "node_id": n.node_id,
                "roles": ",".join(n.roles),
                "pid": pid,
                "running": running,
                "paused": n.node_id in self._paused,
                "health": self.health(n.node_id) if running else {},
                "broker": f"127.0.0.1:{n.broker_port}" if n.broker_port else "",
                "controller": f"127.0.0.1:{n.controller_port}" if n.controller_port else "",
                "metrics": self.metrics_url(n.node_id),
                "log": str(self.node_log(n.node_id)),
            })
        return rows


def check_health(target: str, timeout_s: float = RPC_TIMEOUT_S, service: str = "",
                 security: SecurityConfig | None = None) -> str:
    """Standard gRPC health check; the status name, or UNREACHABLE / the gRPC error code."""
    try:
        with make_channel(target, security) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                        timeout=timeout_s)
    except grpc.RpcError as e:
        code = e.code()
        return "UNREACHABLE" if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
            else code.name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a JSON string literal is a valid TOML basic string
