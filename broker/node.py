"""``brook-server``: one Brook node process (controller, broker, or both).

    brook-server --config node.toml [--override key=value ...] [--log-level DEBUG]

Starts the roles named by ``process.roles`` (the controller first, so a combined node's
broker can register with it), the Prometheus ``/metrics`` server, and on every gRPC
server of the process the standard health service (SERVING once its role is up) and
server reflection (so ``grpcurl`` works). Every gRPC server also gets the metrics
interceptor (per-RPC counts and latency).

Shutdown: the first SIGTERM or SIGINT is a controlled shutdown — health goes
NOT_SERVING, the broker moves its leaderships away, finishes in-flight requests, flushes
its logs and writes its checkpoints (``BrokerServer.stop(controlled=True)``), then the
controller stops. A second SIGTERM/SIGINT exits at once; storage is crash-safe, so that
loses nothing acknowledged.

Exit codes: 0 clean stop, 1 failure while running or starting, 2 invalid config or
usage, 3 forced exit on a second signal, 4 a log directory's disk failed (the broker halts:
``BrokerServer._on_log_dir_failure``), 5 the partitions in the log directories need more file
descriptors than the process's limit allows (nothing opened or changed; the message names the
limit to set: ``storage/fd_budget.py``). Do not restart on 5 before raising the limit.

At start the soft file-descriptor limit is raised to the hard one (as the JVM does for Kafka).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import faulthandler
import gc
import inspect
import logging
import os
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.config import ConfigError, NodeConfig, keys_markdown, load_config
from broker.log_limits import QuietAsyncioSslEof, log_handler
from broker.metrics import (
    BrokerCollector,
    BudgetCollector,
    ControllerCollector,
    CpuShareCollector,
    GroupCollector,
    GrpcConnectionsCollector,
    KafkaListenerCollector,
    NodeMetrics,
    PauseCollector,
    PoolCollector,
    ReceiveCollector,
    ReplicationListenerCollector,
    SecurityCollector,
)
from broker.receiving import ReceiveStats
from broker.stalls import GcPauses
from proto.errors import DuplicateBrokerRegistrationError, InvalidConfigError
from storage.dir_lock import DirectoryInUseError, DirectoryLock, lock_directories
from storage.fd_budget import DescriptorLimitError, partition_capacity, raise_soft_limit_to_hard

log = logging.getLogger("brook.node")

CONTROLLER_READY_MAX_BEHIND = 100  # committed Raft entries a ready controller may still have to apply

LOG_FORMAT = "%(asctime)s %(levelname)-5s [%(threadName)s] %(name)s: %(message)s"
EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_FORCED = 0, 1, 2, 3
EXIT_DESCRIPTORS = 5  # the logs found need more file descriptors than the limit (storage/fd_budget.py)
# Bound on the whole controlled shutdown beyond the configured leadership-move timeout:
# a stop that hangs must not keep the process alive forever.
SHUTDOWN_MARGIN_S = 30.0
PARENT_PID_ENV = "BROOK_LOCAL_PARENT_PID"  # set by deploy.local.cluster for nodes it owns


# ----------------------------------------------------------------------------- gRPC servers


HEALTH_SET_TIMEOUT_S = 5.0


@dataclass
class ServerHooks:
    """Health and reflection attached to one gRPC server created by a role.

    A grpc.aio server (``loop`` set) gets the asyncio health servicer: it answers on the
    server's event loop, so it needs no worker thread however busy the server is; its
    status changes are scheduled onto that loop.
    """

    role: str
    server: Any  # grpc.Server or grpc.aio.Server
    health: Any  # health.HealthServicer or health.aio.HealthServicer
    service_names: list[str] = field(default_factory=list)
    reflection_on: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    pending: Any = None  # a status change scheduled on the loop at creation (kept so it is not collected)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            self._call(self.health.set, name, status)

    def enter_graceful_shutdown(self) -> None:
        self._call(self.health.enter_graceful_shutdown)

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.loop is None:
            fn(*args)
            return
        if self.loop.is_closed() or not self.loop.is_running():
            return  # the server's loop has stopped: nothing is served any more
        try:
            asyncio.run_coroutine_threadsafe(fn(*args), self.loop).result(HEALTH_SET_TIMEOUT_S)
        except Exception:  # a stopping loop may drop the coroutine; health is then moot
            log.warning("%s: health status change did not run", self.role, exc_info=True)

    def enable_reflection(self) -> None:
        if self.reflection_on:
            return
        names = [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        # Before the server starts (see GrpcInstrumentation._record_services): grpcio refuses the
        # registered-method half of a servicer added later, with a WARNING on every node start.
        reflection.enable_server_reflection(names, self.server)
        self.reflection_on = True


def _add_metrics(interceptors: list[Any], metrics: Any) -> None:
    """Put the metrics interceptor first, or after those that must see every call first (``outermost``:
    the startup gate, broker/startup_gate.py; a receive gate, serving unary methods as request streams that
    metrics would not time, broker/receiving.py)."""
    at = 0
    while at < len(interceptors) and getattr(interceptors[at], "outermost", False):
        at += 1
    interceptors.insert(at, metrics)


class GrpcInstrumentation:
    """Gives every gRPC server the roles create in this process the metrics interceptor and a
    health service, and records which services each registers (for reflection).

    The roles build their own servers with ``grpc.server(...)`` (controller) or
    ``grpc.aio.server(...)`` (broker, called on its event loop); interceptors can only be set
    at construction, so for the life of the node process both are wrapped. That keeps the
    roles free of any metrics or health code (CONTRACTS.md: "no change in other code").
    """

    def __init__(self, interceptor: grpc.ServerInterceptor,
                 aio_interceptor: grpc.aio.ServerInterceptor | None = None) -> None:
        self._interceptor = interceptor
        self._aio_interceptor = aio_interceptor
        self._original: Callable[..., grpc.Server] | None = None
        self._original_aio: Callable[..., grpc.aio.Server] | None = None
        self._role = "node"
        self._lock = threading.Lock()
        self.servers: list[ServerHooks] = []

    @contextlib.contextmanager
    def role(self, name: str) -> Iterator[None]:
        """Servers created inside this block belong to role ``name``."""
        with self._lock:
            previous, self._role = self._role, name
        try:
            yield
        finally:
            with self._lock:
                self._role = previous

    def install(self) -> None:
        if self._original is not None:
            return
        self._original = grpc.server
        grpc.server = self._make_server  # type: ignore[assignment]
        self._original_aio = grpc.aio.server
        grpc.aio.server = self._make_aio_server  # type: ignore[assignment]

    def uninstall(self) -> None:
        if self._original is not None:
            grpc.server = self._original  # type: ignore[assignment]
            self._original = None
        if self._original_aio is not None:
            grpc.aio.server = self._original_aio  # type: ignore[assignment]
            self._original_aio = None

    def _make_aio_server(self, *args: Any, **kwargs: Any) -> grpc.aio.Server:
        """The grpc.aio twin of ``_make_server``; called on the loop that will run the server."""
        assert self._original_aio is not None
        interceptors = list(kwargs.pop("interceptors", None) or ())
        if self._aio_interceptor is not None:
            _add_metrics(interceptors, self._aio_interceptor)
        server = self._original_aio(*args, interceptors=interceptors, **kwargs)
        hooks = ServerHooks(role=self._role, server=server, health=health.aio.HealthServicer(),
                            loop=asyncio.get_running_loop())
        health_pb2_grpc.add_HealthServicer_to_server(hooks.health, server)
        # NOT_SERVING until the role is up. We run on the loop (set_serving would wait on it):
        # schedule the change; it runs before the server can start and answer a check.
        hooks.pending = asyncio.get_running_loop().create_task(
            hooks.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING))
        self._record_services(server, hooks)
        with self._lock:
            self.servers.append(hooks)
        return server

    def _make_server(self, *args: Any, **kwargs: Any) -> grpc.Server:
        assert self._original is not None
        interceptors = list(kwargs.pop("interceptors", None) or ())
        _add_metrics(interceptors, self._interceptor)
        server = self._original(*args, interceptors=interceptors, **kwargs)
        hooks = ServerHooks(role=self._role, server=server, health=health.HealthServicer())
        health_pb2_grpc.add_HealthServicer_to_server(hooks.health, server)
        hooks.set_serving(False)
        self._record_services(server, hooks)
        with self._lock:
            self.servers.append(hooks)
        return server

    @staticmethod
    def _record_services(server: Any, hooks: ServerHooks) -> None:
        add_generic = server.add_generic_rpc_handlers
        add_registered = getattr(server, "add_registered_method_handlers", None)

        def generic(handlers: Sequence[Any]) -> None:
            for h in handlers:
                name_of = getattr(h, "service_name", None)
                name = name_of() if callable(name_of) else None
                if name and name not in hooks.service_names and name != health.SERVICE_NAME:
                    hooks.service_names.append(name)
            add_generic(handlers)

        server.add_generic_rpc_handlers = generic  # type: ignore[method-assign]
        if add_registered is not None:
            def registered(service_name: str, method_handlers: Any) -> None:
                if service_name not in hooks.service_names and service_name != health.SERVICE_NAME:
                    hooks.service_names.append(service_name)
                add_registered(service_name, method_handlers)

            server.add_registered_method_handlers = registered  # type: ignore[method-assign]

        # Reflection lists the services registered so far: every role registers its own before it
        # starts the server, and nothing can be added to a started one.
        start = server.start
        if inspect.iscoroutinefunction(start):
            async def start_aio() -> None:
                hooks.enable_reflection()
                await start()

            server.start = start_aio  # type: ignore[method-assign]
        else:
            def start_sync() -> None:
                hooks.enable_reflection()
                start()

            server.start = start_sync  # type: ignore[method-assign]

    def role_up(self, role: str) -> None:
        for hooks in self._of(role):
            hooks.enable_reflection()
            hooks.set_serving(True)
            log.info("%s: gRPC health SERVING for %s", role, ", ".join(hooks.service_names) or "(no services)")

    def role_down(self, role: str) -> None:
        for hooks in self._of(role):
            hooks.set_serving(False)

    def all_down(self) -> None:
        for hooks in list(self.servers):
            hooks.enter_graceful_shutdown()

    def _of(self, role: str) -> list[ServerHooks]:
        with self._lock:
            return [h for h in self.servers if h.role == role]


# ----------------------------------------------------------------------------- the node


class Node:
    """The roles of one node plus metrics; ``start`` then ``stop`` (once)."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.metrics = NodeMetrics.create(config.node_id, config.roles, config.cluster_id)
        self.grpc = GrpcInstrumentation(self.metrics.interceptor, self.metrics.aio_interceptor)
        self.controller: Any = None
        self.broker: Any = None
        self.group_coordinator: Any = None
        self.metrics_port: int | None = None
        self.health: Any = None
        self.console: Any = None
        self._console_data: Any = None
        self.health_port: int | None = None
        self._up = False
        self._stopped = threading.Event()
        self.gc_pauses = GcPauses()
        self._dir_locks: list[DirectoryLock] = []

    def start(self) -> None:
        cfg = self.config
        # Every directory this node writes is locked first (storage/dir_lock.py): a second node pointed at one of
        # them (a copied config, a forgotten process) stops here with one line, having bound and changed nothing.
        # The metrics port was bound first, so a second copy of a running node failed on that port instead,
        # with a traceback (docs audit).
        data_dirs = ([cfg.metadata_log_dir] if cfg.is_controller else []) + (cfg.log_dirs if cfg.is_broker else [])
        self._dir_locks = lock_directories(d for d in data_dirs if d is not None)
        # Then metrics: a taken metrics port fails the start before any role joins the cluster.
        addr = cfg.metrics_address
        if addr is not None:
            # With an authorizer, the page (every topic, partition and group) is for callers allowed DESCRIBE on
            # the cluster, as the console; a caller is refused until this node's authorizer is up.
            may_scrape = self._may_scrape if str(cfg.values["authorizer.class.name"] or "").strip() else None
            with _listener_bind("metrics.listener", addr):
                self.metrics_port = self.metrics.serve(*addr, tls=cfg.metrics_tls(), may_scrape=may_scrape)
        if cfg.health_address is not None:  # before the roles: a startup probe sees "starting"
            from broker.health import HealthServer

            with _listener_bind("health.listener", cfg.health_address):
                self.health = HealthServer(*cfg.health_address, live=self.liveness, ready=self.readiness)
                self.health.start()
            self.health_port = self.health.port
        cfg.configure_principals()
        self.grpc.install()
        self.gc_pauses.install()
        self.metrics.add(PauseCollector(lambda: getattr(self.broker, "loop_monitor", None), self.gc_pauses))
        # One collector each for every role: a family may appear once on a page (a combined node has both).
        self.metrics.add(SecurityCollector({"controller": lambda: getattr(self.controller, "_security", None),
                                            "broker": lambda: getattr(self.broker, "security", None)}))
        self.metrics.add(GrpcConnectionsCollector({
            "controller": lambda: getattr(self.controller, "connections_per_ip", None),
            "broker": lambda: getattr(self.broker, "connections_per_ip", None)}))
        if cfg.is_controller:
            cfg.metadata_log_dir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            from metadata_quorum.node import ControllerNode

            with self.grpc.role("controller"):
                self.controller = ControllerNode(cfg.controller_settings())
                self.controller.start()
            self.metrics.add(ControllerCollector(lambda: self.controller))
            self.grpc.role_up("controller")
            log.info("controller %d started (voters %s)", cfg.node_id, sorted(cfg.voters))
        if cfg.is_broker:
            for d in cfg.log_dirs:
                d.mkdir(parents=True, exist_ok=True)
            from broker import group_coordinator, txn_coordinator
            from broker.server import BrokerServer

            # GROUPS' coordinator is a broker extension: it registers its gRPC service on the
            # broker's server at start; the last extension picks up the object for metrics.
            extensions = [group_coordinator.install, txn_coordinator.install, self._remember_coordinator]
            with self.grpc.role("broker"):
                self.broker = BrokerServer(cfg.broker_settings(), extensions=extensions)
                if self.controller is not None:  # combined: a lost quorum ends a controlled shutdown early
                    self.broker.quorum_reachable = self.controller.raft.has_quorum
                self.broker.start()
            self.metrics.add(BrokerCollector(lambda: getattr(self.broker, "replica_manager", None), cfg.log_dirs))
            self.metrics.add(GroupCollector(lambda: self.group_coordinator))
            self.metrics.add(PoolCollector(lambda: self.broker.pool_stats() if self.broker is not None else {}))
            self.metrics.add(BudgetCollector(lambda: self.broker.budget_stats() if self.broker is not None
                                             else (0, 0, 0)))
            self.metrics.add(CpuShareCollector(lambda: getattr(getattr(self.broker, "capacity", None), "cpu", None)))
            self.metrics.add(ReceiveCollector(lambda: self.broker.receive_stats() if self.broker is not None
                                              else ReceiveStats()))
            self.metrics.add(KafkaListenerCollector(lambda: self.broker.kafka_listeners if self.broker is not None
                                                    else []))
            self.metrics.add(ReplicationListenerCollector(
                lambda: self.broker.replication_listener if self.broker is not None else None))
            if cfg.console_address is not None:
                self._start_console(cfg)
            self.grpc.role_up("broker")
            log.info("broker %d started on %s", cfg.node_id, cfg.listeners["BROKER"])
        self._up = True
        log.info("node %d up: roles %s, cluster %s", cfg.node_id, ",".join(cfg.roles), cfg.cluster_id)

    def _may_scrape(self, caller: Any) -> bool:
        """May ``caller`` read /metrics: DESCRIBE on the cluster, by this node's authorizer (the broker's, else
        the controller's); False while neither role is up."""
        from broker import authorizer as authz

        security = getattr(self.broker, "security", None) or getattr(self.controller, "_security", None)
        authorizer = getattr(security, "authorizer", None)
        return authorizer is not None and authorizer.authorize(caller, authz.DESCRIBE, authz.CLUSTER)

    def _start_console(self, cfg: NodeConfig) -> None:
        from broker.console import ADMIN_TIMEOUT_MS, ConsoleData, ConsoleServer
        from client.admin import Admin

        broker = self.broker
        s = broker.settings
        host, port = s.advertised or (s.host, broker.port)
        # The console reads the cluster as this node (its certificate: a super user for the ACLs) and
        # shows each viewer only what the viewer may DESCRIBE.
        data = ConsoleData(broker, lambda: Admin(f"{host}:{port}", request_timeout_ms=ADMIN_TIMEOUT_MS,
                                                 security=s.inter_broker_security),
                           broker.security.authorizer)
        with _listener_bind("console.listener", cfg.console_address):
            self.console = ConsoleServer(*cfg.console_address, data, tls=cfg.console_tls(),  # type: ignore[misc]
                                         extra_hosts=(str(host),))
            self.console.start()
        self._console_data = data
        log.info("console on %s://%s:%d", "https" if cfg.console_tls() is not None else "http",
                 cfg.console_address[0], self.console.port)  # type: ignore[index]

    # ---- health (broker/health.py) ----
    def liveness(self) -> tuple[bool, str]:
        if self._stopped.is_set():
            return False, "stopping"
        if not self._up:
            return False, "starting"
        if self.broker is not None:
            return self.broker.liveness()
        return True, "controller running"

    def readiness(self) -> tuple[bool, str]:
        live, why = self.liveness()
        if not live:
            return False, why
        if self.broker is not None:
            return self.broker.readiness()
        if self.controller is not None:
            raft = self.controller.raft
            if raft.leader_address() is None:
                return False, "the metadata quorum has no leader"
            status = raft.status()
            behind = status.commit_index - status.last_applied
            if behind > CONTROLLER_READY_MAX_BEHIND:
                return False, f"applying the metadata log: {behind} committed entries to go"
        return True, "the metadata quorum has a leader"

    def _remember_coordinator(self, broker: Any) -> object:
        """Broker extension run last: finds the group coordinator the GROUPS extension attached."""
        self.group_coordinator = getattr(broker, "group_coordinator", None)
        return self.group_coordinator

    def stop(self, controlled: bool = True) -> None:
        """Broker first (its controlled shutdown needs the quorum), then the controller."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        controlled = controlled and bool(self.config["controlled.shutdown.enable"])
        self.grpc.role_down("broker")
        if self.broker is not None:
            log.info("broker %d: %s shutdown", self.config.node_id, "controlled" if controlled else "immediate")
            _stop_quietly("broker", lambda: self.broker.stop(controlled=controlled))
        # The console after the broker: its server takes up to half a second to stop, and a controlled
        # shutdown that began that much later than its peers' could find their controllers, and so the
        # quorum it needs, already gone (every node stopped at once: it then waited out its timeout).
        if self.console is not None:
            _stop_quietly("console", self.console.stop)
            _stop_quietly("console admin client", self._console_data.close)
        self.grpc.role_down("controller")
        if self.controller is not None:
            log.info("controller %d: stopping", self.config.node_id)
            _stop_quietly("controller", self.controller.stop)
        self.grpc.all_down()
        self.metrics.close()
        self.gc_pauses.uninstall()
        if self.health is not None:
            _stop_quietly("health listener", self.health.stop)
        self.grpc.uninstall()
        for lock in self._dir_locks:  # last: nothing of this node writes its directories any more
            lock.release()
        log.info("node %d stopped", self.config.node_id)


@contextlib.contextmanager
def _listener_bind(key: str, address: tuple[str, int] | None) -> Iterator[None]:
    """A port another process holds is a misconfiguration, not a crash: one line naming the key (the node's
    start answers InvalidConfigError so), not the socket's traceback."""
    try:
        yield
    except OSError as e:
        if e.errno not in _BIND_ERRNOS or e.filename is not None or isinstance(e, ssl.SSLError):
            raise  # a certificate file, say: not the address
        host, port = address or ("?", 0)
        raise InvalidConfigError(f"{key} {host}:{port} cannot be bound: {e.strerror or e}") from e


_BIND_ERRNOS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("brook")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _stop_quietly(what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:  # shutdown goes on: the next role still needs stopping
        log.exception("%s: error while stopping", what)


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="brook-server",
        description="Run one Brook node (controller, broker or both, per process.roles).",
        epilog="Environment: BROOK_<KEY> overrides a key (log.dirs -> BROOK_LOG_DIRS). Precedence: "
               "file < environment < --override. Example: brook-server --config node.toml "
               "--override log.retention.hours=24",
    )
    p.add_argument("--config", "-c", help="node TOML file (required to run)")
    p.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key (repeatable)")
    p.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="log level on stderr (default: logging.level from the config, INFO)")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.add_argument("--version", action="version", version=f"brook-server {_version()}")
    p.add_argument("--describe-config", action="store_true",
                   help="print every config key (type, default, doc) as a Markdown table and exit")
    args = p.parse_args(argv)
    if not args.config and not args.describe_config:
        p.error("the following arguments are required: --config")
    return args


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level), handlers=[log_handler(LOG_FORMAT)], force=True)
    report_fatal_signals()
    logging.Formatter.converter = time.gmtime  # UTC timestamps: nodes on several hosts line up
    # grpc's and pysyncobj's own loggers are chatty at DEBUG; keep them at WARNING unless asked.
    if level != "DEBUG":
        for noisy in ("grpc", "pysyncobj"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("asyncio").addFilter(QuietAsyncioSslEof())


def report_fatal_signals() -> None:
    """A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) writes every thread's Python stack to the
    log stream before the process dies. Without it a node died without a word: a full disk under the
    metadata directory ends pysyncobj's journal, written through mmap, with SIGBUS (a probe saw the node
    gone 9 s after the first ENOSPC, and its log said nothing)."""
    faulthandler.enable(file=sys.stderr, all_threads=True)


class _Signals:
    """First SIGTERM/SIGINT asks for a controlled stop; the second exits at once."""

    def __init__(self) -> None:
        self.stop_requested = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested.is_set():
            log.warning("%s again: exiting now without waiting for the controlled shutdown", name)
            logging.shutdown()
            os._exit(EXIT_FORCED)
        log.info("%s: controlled shutdown (send again to exit at once)", name)
        self.stop_requested.set()


def _watch_parent(signals: _Signals) -> None:
    """Local clusters (deploy/local) pass their pid: stop when that process is gone, so a
    crashed test run leaves no orphan nodes behind."""
    raw = os.environ.get(PARENT_PID_ENV, "")
    if not raw.isdigit():
        return
    parent = int(raw)

    def watch() -> None:
        while not signals.stop_requested.wait(1.0):
            if os.getppid() != parent:
                log.warning("parent process %d is gone: controlled shutdown", parent)
                signals.stop_requested.set()
                return

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _tls_files_problem(config: Any) -> str | None:
    """What is wrong with the certificate, key or CA files of the node's TLS listeners (read and checked as a
    listener loads them, naming the key and file), or None. Before, --check passed such files, and a start found
    them only when it opened the listener: exit 1, the wrong file named, and tracebacks from the stop."""
    from broker.tls import ReloadingCertificates

    for name in config.listeners:
        tls = config.server_tls(name)
        if tls is None:
            continue
        try:
            ReloadingCertificates(tls)
        except InvalidConfigError as e:
            return f"listener {name}: {e.message}"
        except (OSError, ValueError) as e:
            return f"listener {name}: TLS files of {tls.cert}: {e}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.describe_config:
        print(keys_markdown())
        return EXIT_OK
    try:
        config = load_config(args.config, args.override)
    except ConfigError as e:
        print(f"brook-server: invalid config: {e.message}", file=sys.stderr)
        return EXIT_CONFIG
    if (problem := _tls_files_problem(config)) is not None:
        print(f"brook-server: invalid config: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check:
        print(f"brook-server: {args.config} is valid (node {config.node_id}, roles {','.join(config.roles)})")
        return EXIT_OK
    setup_logging(args.log_level or config["logging.level"])
    threading.current_thread().name = f"node-{config.node_id}"
    before, after = raise_soft_limit_to_hard()
    if after != before:
        log.info("file-descriptor limit raised from %d to %d (the hard limit)", before, after)
    if "broker" in config.roles:
        log.info("file-descriptor limit %d: this broker takes at most %s partition replicas", after,
                 partition_capacity(int(config["max.partitions.per.broker"])) or "unbounded")
    signals = _Signals()
    signals.install()
    _watch_parent(signals)
    node = Node(config)
    try:
        node.start()
    except DescriptorLimitError as e:
        # Not a crash to retry: the same logs and limit give the same answer. One line naming the figures.
        log.critical("node %d refuses to start: %s", config.node_id, e.message)
        node.stop(controlled=False)
        return EXIT_DESCRIPTORS
    except (DirectoryInUseError, DuplicateBrokerRegistrationError, InvalidConfigError) as e:
        # A misconfiguration (a directory of another process, node or cluster; a node id in use), not a
        # bug: one line, no traceback.
        log.error("node %d failed to start: %s", config.node_id, e)
        node.stop(controlled=False)
        return EXIT_FAILURE
    except Exception as e:
        log.exception("node %d failed to start: %s", config.node_id, e)
        node.stop(controlled=False)
        return EXIT_FAILURE
    # What start-up made (modules, gRPC and protobuf tables, the node's own structures) lives as
    # long as the process: out of the collector's sight, a full collection scans only what came
    # after, and no longer stalls requests for 40-70 ms (measured on a 2-core machine).
    gc.collect()
    gc.freeze()
    # Signal handlers run on the main thread between waits; poll so they are never delayed.
    while not signals.stop_requested.wait(0.5):
        pass
    timeout_s = config["controlled.shutdown.timeout.ms"] / 1000 + SHUTDOWN_MARGIN_S
    stopper = threading.Thread(target=node.stop, name="shutdown", daemon=True)
    stopper.start()
    stopper.join(timeout_s)
    if stopper.is_alive():
        log.error("shutdown did not finish within %.0f s: exiting anyway", timeout_s)
        logging.shutdown()
        os._exit(EXIT_FAILURE)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
