"""BrokerServer: one broker — gRPC service, partition logs, replication, and its bond to the quorum.

Lifecycle: open the logs, serve gRPC, register with the active controller (getting a
broker epoch), heartbeat every ``broker.heartbeat.interval.ms``, follow metadata with
``WatchMetadata`` and turn each change into leader/follower roles (ReplicaManager).
``stop(controlled=True)`` first asks the controller to move this broker's leaderships
away (KRaft controlled shutdown), then stops serving, fetchers and logs in that order.

Serving: the client-facing gRPC server is a grpc.aio server on one asyncio event loop
thread per broker ("broker-N-loop"); handlers are coroutines that hold no thread while a
request waits (see broker/service.py). Blocking work runs on bounded executors: ``io``
(``num.io.threads``) for client requests, ``replication`` (``num.replica.io.threads``)
for follower fetches; the group coordinator's service has its own (broker/group_service.py). The health service answers on
the loop itself, so a client flood cannot make a liveness probe time out.

Safety: a broker that has not heard back from the controller for a whole session
(``broker.session.timeout.ms``) assumes it has been fenced and stops accepting writes
as leader until a heartbeat succeeds again — by then metadata names its successor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from broker.admission import (
    DEFAULT_CONNECTION_IDLE_MS,
    DEFAULT_FETCH_BYTES_PER_CLIENT,
    ByteBudget,
    ClientByteShares,
    ClientLimits,
    ConnectionsPerIp,
    connections_within_descriptors,
)
from broker.cert_revocation import (
    AioCertificateInterceptor,
    ConnectionTrust,
    GrpcCertificateCheck,
    TrustAnchors,
)
from broker.cpu_shares import DEFAULT_MAX_PERCENT as DEFAULT_CPU_PERCENT_PER_IP
from broker.cpu_shares import CpuShares
from broker.fair_pool import FairExecutor
from broker.grpc_connections import PerAddressConnections
from broker.metadata_cache import MetadataCache
from broker.producer_ids import ProducerIdManager
from broker.receiving import (
    DEFAULT_FETCH_STREAMS,
    DEFAULT_PRODUCE_STREAMS,
    DEFAULT_RECEIVE_TIMEOUT_MS,
    DEFAULT_RECEIVING,
    DEFAULT_RECEIVING_PER_CLIENT,
    DEFAULT_REQUEST_MAX_BYTES,
    DEFAULT_STREAMS_PER_CLIENT,
    OTHER_STREAMS,
    OTHER_STREAMS_TOTAL,
    ReceiveGate,
    ReceiveSlots,
    ReceiveStats,
    StreamCounts,
)
from broker.replica_manager import ReplicaManager
from broker.replication_listener import ReplicationListener
from broker.security import NodeSecurity, broker_security
from broker.service import BrokerService, Capacity, add_to_server
from broker.stalls import DEFAULT_STALL_S, LoopMonitor
from broker.startup_gate import MetadataGate
from broker.tls import HANDSHAKE_TIMEOUT_MS, ServerTls, bind_port
from client.security import SecurityConfig
from metadata_quorum import features
from metadata_quorum.client import ControllerClient
from proto import common_pb2, controller_pb2, errors
from proto.errors import ErrorCode
from replication.fetcher import FetcherConfig
from storage import meta_properties
from storage.checkpoints import fsync_dir, write_atomically
from storage.cleaner import MAP_ENTRY_BYTES
from storage.disk_errors import EXIT_DISK_FAILURE, halt_for_disk_failure
from storage.fd_budget import partition_capacity
from storage.log_manager import LogManager
from storage.producer_state import (
    DEFAULT_PROCESS_MAX_PRODUCERS,
    DEFAULT_PRODUCER_EXPIRATION_MS,
    PRODUCER_BUDGET,
)

log = logging.getLogger(__name__)

# The process's exit code when a log directory's disk failed (see BrokerServer._on_log_dir_failure).
EXIT_LOG_DIR_FAILURE = EXIT_DISK_FAILURE

# The largest message the broker sends: a fetch answer holds at most fetch.max.bytes (55 MiB by default), or one
# batch beyond it of up to max.message.bytes, at most cluster_configs.MAX_MESSAGE_BYTES_LIMIT (64 MiB).
GRPC_MAX_MESSAGE_BYTES = 128 * 1024 * 1024
LOOP_START_TIMEOUT_S = 10.0
LOOP_STALL_S = 15.0  # a loop silent this long is not alive (its monitor stamps a time every 50 ms)
DEFAULT_MAX_CONNECTIONS = 10_000
# HTTP/2's recommended floor for SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113 5.1.2). gRPC counts a
# stream reset before the broker handled it against this until it has (its rapid-reset defence,
# CVE-2023-44487), and sheds calls at random (CANCELLED) once its backlog of unhandled ones is long.
# At 2,000 (the old bound, max.inflight.requests.per.ip), four connections resetting calls as fast as
# they could had a third of another client's Metadata calls cancelled in some runs
# (tests/broker/test_rapid_reset.py).
DEFAULT_STREAMS_PER_CONNECTION = 100
SECURITY_WORKERS = 4  # SecurityService handlers (SCRAM exchanges, ACL and user admin): short and rare
SERVER_STOP_GRACE_S = 1.0
REGISTER_TIMEOUT_S = 60.0
DUPLICATE_RETRY_S = 2.0  # another process holds this node id: its session ends within broker.session.timeout.ms
INCARNATION_FILE = "broker.incarnation"
FIRST_METADATA_WAIT_S = 30.0
CONTROLLED_SHUTDOWN_TIMEOUT_S = 30.0
# A broker stops waiting for its controlled shutdown once no controller can answer it for this long:
# a combined node's own controller reaches no majority of the voters, or (a broker-only node) no
# controller answers with a leader known. Nothing can move its leaderships until they return.
NO_QUORUM_GIVE_UP_S = 2.0
QUORUM_PROBE_TIMEOUT_S = 1.0  # a broker-only node's DescribeQuorum probe of the controllers


@dataclass(frozen=True)
class ListenerSpec:
    """An extra client listener of the broker (besides BROKER): where it binds, its TLS, what it advertises."""

    name: str
    host: str
    port: int
    tls: ServerTls | None = None
    advertised: tuple[str, int] | None = None
    protocol: str = "PLAINTEXT"
    # "kafka": Kafka's wire protocol (broker/kafka_wire), for unmodified Kafka clients; "replication": the
    # followers' fetch sessions (broker/replication_listener.py)
    wire: str = "grpc"


@dataclass
class BrokerSettings:
    node_id: int
    host: str
    port: int
    rack: str
    log_dirs: list[Path]
    cluster_id: str
    controller_endpoints: list[tuple[str, int]]
    defaults: dict[str, str] = field(default_factory=dict)
    tls: ServerTls | None = None  # the BROKER (inter-broker) listener's TLS; None = plaintext
    advertised: tuple[str, int] | None = None  # BROKER's advertised host:port (None: the bound one)
    extra_listeners: list[ListenerSpec] = field(default_factory=list)
    inter_broker_security: SecurityConfig = field(default_factory=SecurityConfig)  # to other brokers
    controller_security: SecurityConfig = field(default_factory=SecurityConfig)  # to the controllers


@dataclass(slots=True)
class BrokerStats:
    node_id: int
    broker_epoch: int
    registered: bool
    fenced: bool
    lease_valid: bool
    metadata_version: int
    partitions: int
    leaders: int
    followers: int
    fetchers: int


def record_incarnation(log_dir: Path, incarnation_id: str) -> str:
    """Write ``incarnation_id`` to ``log_dir``'s INCARNATION_FILE (durably, before it registers) and
    return the one found there: the incarnation of this node's previous process, "" if none.

    The node holds ``log_dir``'s lock (storage/dir_lock.py), so whoever wrote the file before is gone:
    the controller takes a registration naming the incarnation it replaces at once instead of waiting
    for the old session to run out (metadata_quorum/controller.py, ``_refuse_duplicate``).
    """
    path = log_dir / INCARNATION_FILE
    previous = ""
    try:
        found = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        found = ""
    except (OSError, UnicodeDecodeError) as e:
        log.warning("%s unreadable (%s): registering as a first start", path, e)
        found = ""
    if found:
        if len(found) <= 64 and all(ch in "0123456789abcdef" for ch in found):
            previous = found
        else:
            log.warning("%s does not hold an incarnation id; registering as a first start", path)
    write_atomically(path, incarnation_id.encode("ascii") + b"\n")
    return previous



# In a log directory found new at start until the controller has taken the registration that says so
# (RegisterBrokerRequest.storage_created): a process stopped before then says it again at its next start.
STORAGE_CREATED_MARKER = ".brook_storage_created"


def check_log_dirs(log_dirs: list[Path], cluster_id: str, node_id: int) -> bool:
    """Check that each log directory is this node's (``meta_properties.check_or_write``); True when one of them
    is new (no meta.properties and no partition log: a first start, a replaced or wiped disk), or was found so
    at a start whose registration the controller has not taken yet (``STORAGE_CREATED_MARKER``: a process
    stopped in between says it again, although meta.properties exists by then)."""
    created = False
    for log_dir in log_dirs:
        if meta_properties.check_or_write(log_dir, cluster_id, node_id) and not _holds_logs(log_dir):
            write_atomically(log_dir / STORAGE_CREATED_MARKER, b"")
        created = created or (log_dir / STORAGE_CREATED_MARKER).exists()
    return created


def storage_registered(log_dirs: list[Path]) -> None:
    """The controller took a registration saying the storage is new: the next start is a normal restart."""
    for log_dir in log_dirs:
        (log_dir / STORAGE_CREATED_MARKER).unlink(missing_ok=True)
        fsync_dir(log_dir)


def _holds_logs(log_dir: Path) -> bool:
    """Whether ``log_dir`` has a partition's log (a directory named <topic>-<partition>)."""
    from storage.log import parse_partition_dir

    try:
        for child in log_dir.iterdir():
            try:
                parse_partition_dir(child.name)
            except ValueError:
                continue
            if child.is_dir():
                return True
    except OSError:
        return False
    return False

class BrokerServer:
    def __init__(self, settings: BrokerSettings, *,
                 extensions: list[Callable[[BrokerServer], object]] | None = None) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        d = settings.defaults
        self.heartbeat_interval_ms = int(d.get("broker.heartbeat.interval.ms", "2000"))
        self.session_timeout_ms = int(d.get("broker.session.timeout.ms", "9000"))
        self.stall_fence_s = int(d.get("event.loop.stall.fence.ms", "5000")) / 1000
        # A log directory was found empty and new at start (no meta.properties, no partition logs): this broker
        # has none of the records it had (see RegisterBrokerRequest.storage_created).
        self.storage_created = False
        self._withholding_heartbeats = False  # the event loop is stuck: see heartbeat_once
        self._extensions = list(extensions or [])
        self._servicer_fns: list[Callable[[grpc.aio.Server], None]] = []
        self.incarnation_id = uuid.uuid4().hex
        self.previous_incarnation_id = ""  # read from the first log directory at start
        self.broker_epoch = -1
        self.fenced = True
        self._last_heartbeat_ok = 0.0
        self._stopping = threading.Event()
        self._want_shutdown = False
        self._should_shutdown = threading.Event()
        # Set by a combined node: does its own controller reach a majority of the voters? (Else the
        # controlled shutdown asks the controllers, see _controllers_have_a_leader.)
        self.quorum_reachable: Callable[[], bool] | None = None
        self._threads: list[threading.Thread] = []
        self._metadata_lock = threading.RLock()  # cache + replica manager move together (see BrokerService)
        self._started = False
        self.port = settings.port
        self.grpc_server: grpc.aio.Server | None = None
        self.connections_per_ip: PerAddressConnections | None = None  # max.connections.per.ip on the gRPC ports
        # max.connections.per.ip and its overrides (host names resolved once), for the gRPC and Kafka ports alike.
        self._connections_per_ip = ConnectionsPerIp.of(settings.defaults, f"broker {settings.node_id}")
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self.loop_monitor: LoopMonitor | None = None  # the loop's lag, stalls and liveness stamp
        self.capacity: Capacity | None = None
        self._security_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.receive_gate: ReceiveGate | None = None
        self.metadata_gate: MetadataGate | None = None
        self.log_manager: Any = None
        self.controller_client: Any = None
        self.metadata_cache = MetadataCache(settings.node_id)
        self.replica_manager: ReplicaManager | None = None
        self.extension_objects: list[object] = []
        self.service: BrokerService | None = None
        self.group_servicer: Any = None  # set by the group coordinator extension
        self.kafka_listeners: list[Any] = []
        self.replication_listener: ReplicationListener | None = None
        self._kafka_listeners_lock = threading.Lock()
        # SCRAM sessions, ACL checks and quotas (broker/security.py); the group coordinator reads .authorizer.
        self.security: NodeSecurity = broker_security(self.metadata_cache, settings.defaults)
        self.authorizer = self.security.authorizer

    # ---- hooks ----
    def add_servicer(self, fn: Callable[[grpc.aio.Server], None]) -> None:
        """Register an extra gRPC service (e.g. GroupCoordinatorService) on the broker's aio server.

        Its handlers must be coroutines (they run on the broker's event loop); blocking work
        goes to a bounded executor of its own, never on the loop.
        """
        if self.grpc_server is not None and not self._started:
            fn(self.grpc_server)
        elif self._started:
            raise RuntimeError("add_servicer after start: gRPC services must be added before serving")
        else:
            self._servicer_fns.append(fn)

    def lease_valid(self) -> bool:
        """Heard from the controller within a session and not fenced: may act as a leader."""
        return (not self.fenced
                and time.monotonic() - self._last_heartbeat_ok < self.session_timeout_ms / 1000)

    # ---- start ----
    def start(self) -> None:
        s = self.settings
        d = s.defaults
        # Before anything reads them: refused if they belong to another node.
        self.storage_created = check_log_dirs([Path(d) for d in s.log_dirs], s.cluster_id, s.node_id)
        PRODUCER_BUDGET.max_producers = int(d.get("producer.id.max.tracked", str(DEFAULT_PROCESS_MAX_PRODUCERS)))
        cleaner_threads = (int(d.get("log.cleaner.threads", "1"))
                           if d.get("log.cleaner.enable", "true").strip().lower() == "true" else 0)
        self.log_manager = LogManager(
            list(s.log_dirs), d,
            flush_check_ms=int(d.get("log.flush.scheduler.interval.ms", "1000")),
            retention_check_ms=int(d.get("log.retention.check.interval.ms", "300000")),
            checkpoint_interval_ms=int(d.get("replica.high.watermark.checkpoint.interval.ms", "5000")),
            cleaner_threads=cleaner_threads,
            cleaner_backoff_ms=int(d.get("log.cleaner.backoff.ms", "15000")),
            cleaner_max_map_entries=max(1, int(d.get("log.cleaner.dedupe.buffer.size", "33554432"))
                                        // max(1, cleaner_threads) // MAP_ENTRY_BYTES),
            scrubber_enabled=d.get("log.scrubber.enable", "true").strip().lower() == "true",
            scrubber_bytes_per_sec=int(d.get("log.scrubber.bytes.per.second", "1048576")),
            scrubber_interval_ms=int(d.get("log.scrubber.interval.ms", "604800000")),
            producer_expiration_ms=int(d.get("producer.id.expiration.ms", str(DEFAULT_PRODUCER_EXPIRATION_MS))),
            producer_expiration_check_ms=int(d.get("producer.id.expiration.check.interval.ms", "600000")),
            on_dir_failure=self._on_log_dir_failure)
        self.log_manager.startup()
        self.previous_incarnation_id = record_incarnation(s.log_dirs[0], self.incarnation_id)
        self.controller_client = ControllerClient(list(s.controller_endpoints), timeout_s=10,
                                                  security=s.controller_security, broker_id=s.node_id)
        fetcher_cfg = FetcherConfig(
            max_wait_ms=int(s.defaults.get("replica.fetch.wait.max.ms", "500")),
            max_bytes=int(s.defaults.get("replica.fetch.response.max.bytes", str(16 * 1024 * 1024))),
            partition_max_bytes=int(s.defaults.get("replica.fetch.max.bytes", str(1024 * 1024))),
            backoff_ms=int(s.defaults.get("replica.fetch.backoff.ms", "200")),
            security=s.inter_broker_security)
        self._start_loop()  # first: the replica fetchers run on it
        self.replica_manager = ReplicaManager(
            s.node_id, self.log_manager, self.metadata_cache, self.controller_client, defaults=s.defaults,
            broker_epoch=lambda: self.broker_epoch, lease_valid=self.lease_valid, fenced=lambda: self.fenced,
            fetcher_config=fetcher_cfg, loop=self.loop)
        producer_ids = ProducerIdManager(s.node_id, self.controller_client, lambda: self.broker_epoch)
        self.capacity = self._make_capacity(d)
        self.grpc_server = self._on_loop(self._make_server(d))
        service = BrokerService(
            s.node_id, self.replica_manager, self.metadata_cache, self.controller_client, producer_ids,
            defaults=s.defaults, controller_endpoints=s.controller_endpoints, capacity=self.capacity,
            metadata_lock=self._metadata_lock, authorizer=self.security.authorizer, quotas=self.security.quotas)
        service.listener_by_tls = self.listener_by_tls()
        self.service = service
        add_to_server(service, self.grpc_server)  # the generated one, but Fetch answers keep their records apart
        self.security.add_service(self.grpc_server)  # SaslAuthenticate (sync handlers: the migration pool)
        for fn in self._servicer_fns:
            fn(self.grpc_server)
        self.connections_per_ip = PerAddressConnections(self._bind_listeners(self.grpc_server),
                                                        self._connections_per_ip, f"broker {s.node_id}")
        for ext in self._extensions:
            self.extension_objects.append(ext(self))
        self._on_loop(self.grpc_server.start())
        self.connections_per_ip.start()
        self._start_replication_listener(service)  # before registering: the endpoint is live when named
        self._started = True
        self.log_manager.start_background()
        self.replica_manager.start()
        self._register(REGISTER_TIMEOUT_S)
        producer_ids.prefetch()  # a block at hand before any producer asks (and should the quorum go)
        self._spawn(self._watch_loop, "metadata-watch")
        self._spawn(self._heartbeat_loop, "heartbeat")
        # Kafka clients connect once the broker knows the cluster (as a Kafka broker opens its listeners
        # when it has caught up), so none sees an empty cluster or an unknown user; gRPC clients are
        # answered UNAVAILABLE until then (broker/startup_gate.py).
        if self.metadata_cache.wait_for(lambda c: c.version > 0, FIRST_METADATA_WAIT_S):
            self._start_kafka_listeners()
        else:
            log.warning("broker %d: no metadata from the controller after %.0fs; client calls are refused "
                        "(UNAVAILABLE) and the Kafka listeners stay closed until it comes", s.node_id,
                        FIRST_METADATA_WAIT_S)
            self._spawn(self._start_kafka_listeners_on_metadata, "kafka-listeners")
        log.info("broker %d started on %s:%d (epoch %d)", s.node_id, s.host, self.port, self.broker_epoch)

    # ---- the event loop and the aio server ----
    def _make_capacity(self, d: dict[str, str]) -> Capacity:
        nid = self.node_id
        budget = int(d.get("queued.max.request.bytes", str(256 * 1024 * 1024)))
        fetch_max = int(d.get("fetch.max.bytes", str(55 * 1024 * 1024)))
        if fetch_max > budget:
            log.warning("broker %d: fetch.max.bytes %d > queued.max.request.bytes %d: a fetch is cut to the budget",
                        nid, fetch_max, budget)
        cpu = CpuShares(float(d.get("request.cpu.max.percent.per.ip", str(DEFAULT_CPU_PERCENT_PER_IP))))
        return Capacity(
            # Client work takes turns between client addresses (broker/fair_pool.py), and what it costs counts
            # against the address's share (broker/cpu_shares.py); replication is the brokers'.
            io=FairExecutor(int(d.get("num.io.threads", "8")), thread_name_prefix=f"broker-{nid}-io", cpu=cpu),
            replication=concurrent.futures.ThreadPoolExecutor(
                max_workers=int(d.get("num.replica.io.threads", "4")), thread_name_prefix=f"broker-{nid}-replica"),
            recompression=FairExecutor(int(d.get("num.recompression.threads", "2")),
                                       thread_name_prefix=f"broker-{nid}-recompress", cpu=cpu),
            cpu=cpu,
            limits=ClientLimits(int(d.get("max.inflight.requests.per.ip", "2000")),
                                int(d.get("max.waiting.fetches.per.ip", "1000"))),
            budget=ByteBudget(budget),
            shares=ClientByteShares(int(d.get("max.fetch.response.bytes.per.ip", str(DEFAULT_FETCH_BYTES_PER_CLIENT)))))

    def _on_log_dir_failure(self, log_dir: Path, exc: OSError) -> None:
        """A disk under a log directory failed (full, over quota, I/O errors, read-only, file size
        limit). Kafka takes the directory offline and halts the broker when none is left; Brook
        halts at once, whatever the number of directories. Staying up, it would keep leading
        partitions it cannot write; halted, its session runs out (broker.session.timeout.ms), the
        controller fences it and elects their other in-sync replicas, and writes go on there.
        Nothing acknowledged is lost: the failed append wrote nothing (segment.append truncates a
        partial write) and every acknowledged record is on the in-sync replicas. No clean
        shutdown: it would write checkpoints to the failed disk. Started again once the disk is
        fixed, the broker recovers its logs and catches up from the leaders."""
        log.critical("broker %d: log directory %s failed (%s); halting the broker (exit code %d) so that the "
                     "other replicas take over its partitions. Fix the disk (free space, replace it) and start "
                     "the broker again.", self.node_id, log_dir, exc, EXIT_LOG_DIR_FAILURE)
        halt_for_disk_failure()

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._loop_thread = threading.Thread(target=run, name=f"broker-{self.node_id}-loop", daemon=True)
        self._loop_thread.start()
        if not ready.wait(LOOP_START_TIMEOUT_S):
            raise RuntimeError(f"broker {self.node_id}: event loop did not start")
        self.loop = loop
        stall_ms = int(self.settings.defaults.get("event.loop.stall.warn.ms", str(round(DEFAULT_STALL_S * 1000))))
        self.loop_monitor = LoopMonitor(f"broker {self.node_id}", stall_s=stall_ms / 1000)
        self.loop_monitor.start(loop, self._loop_thread)

    # ---- health (broker/health.py): in-memory state only, answered from another thread ----
    def liveness(self) -> tuple[bool, str]:
        if not self._started:
            return False, "starting"
        silent = self._loop_silent_s() if self.loop_monitor is not None else float("inf")
        if silent > LOOP_STALL_S:
            return False, f"the broker's event loop has not run for {silent:.0f} s"
        return True, "event loop running"

    def readiness(self) -> tuple[bool, str]:
        """Registered, unfenced, and in the ISR of every hosted partition that has a leader."""
        if not self._started or self.broker_epoch < 0:
            return False, "not registered with the controller yet"
        wanted = sum(1 for lst in self.settings.extra_listeners if lst.wire == "kafka")
        if len(self.kafka_listeners) < wanted:
            return False, "the Kafka listeners open once the first metadata is in"
        if self.fenced:
            return False, "fenced (catching up with metadata, or lost its session)"
        rm = self.replica_manager
        hosted = rm.hosted_partitions() if rm is not None else []
        behind = sum(1 for p in hosted if p.leader_id >= 0 and self.node_id not in p.isr)
        if behind:
            return False, f"{behind} of {len(hosted)} hosted partitions are catching up (not in the ISR)"
        return True, f"in sync on all {len(hosted)} hosted partitions"

    def pool_stats(self) -> dict[str, tuple[int, int]]:
        """{pool: (threads, tasks waiting for a thread)} of the broker's request executors."""
        cap = getattr(self, "capacity", None)
        if cap is None:
            return {}
        out = {}
        for name, pool in (("io", cap.io), ("replication", cap.replication)):
            if isinstance(pool, FairExecutor):
                out[name] = (pool.max_workers, pool.queued())
                continue
            queue = getattr(pool, "_work_queue", None)  # ThreadPoolExecutor keeps no public queue size
            out[name] = (int(getattr(pool, "_max_workers", 0)), queue.qsize() if queue is not None else 0)
        return out

    def budget_stats(self) -> tuple[int, int, int]:
        """(bytes held of queued.max.request.bytes, that limit, client addresses holding fetch answers)."""
        cap = getattr(self, "capacity", None)
        if cap is None:
            return 0, 0, 0
        return cap.budget.used_bytes, cap.budget.total_bytes, cap.shares.clients

    def _on_loop(self, coro: Any, timeout_s: float = 30.0) -> Any:
        """Run a coroutine on the broker's loop from another thread and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def _make_server(self, d: dict[str, str]) -> grpc.aio.Server:
        # Created on the loop: grpc.aio binds a server to the running loop.
        # SecurityService (SCRAM exchanges, ACL/user admin) has sync handlers: they run on a small pool
        # of their own. The session interceptor refuses calls with a stale SCRAM session token.
        self._security_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=SECURITY_WORKERS, thread_name_prefix=f"broker-{self.node_id}-security")
        self.receive_gate = self._make_receive_gate(d)
        self.metadata_gate = MetadataGate(self.node_id, lambda: self.metadata_cache.version > 0)
        # Outside the receive gate: a call whose client certificate the CA bundle no longer trusts is refused
        # before it takes a receive slot.
        self.certificate_check = GrpcCertificateCheck(f"broker {self.node_id}", self.security.certificate_revoked)
        return grpc.aio.server(migration_thread_pool=self._security_pool, interceptors=[
            self.metadata_gate, AioCertificateInterceptor(self.certificate_check), self.receive_gate,
            self.security.aio_interceptor()], options=[
            ("grpc.max_receive_message_length", int(d.get("socket.request.max.bytes", str(DEFAULT_REQUEST_MAX_BYTES)))),
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
            # No BDP probing: a stream is granted HTTP/2's initial 64 KiB window until its message is
            # read, so a call waiting for a receive slot (broker/receiving.py) cannot be sent more.
            # Answers (fetches) are paced by the client's windows, not this.
            ("grpc.http2.bdp_probe", 0),
            # HTTP/2's own per-connection bound: streams past it wait in the client, never reach us.
            ("grpc.max_concurrent_streams", self._streams_per_connection(d)),
            # Connections past the bound are refused at accept: a connection flood cannot take the
            # file descriptors the logs need (segment rolls, index files) nor unbounded memory.
            ("grpc.max_allowed_incoming_connections", self._max_connections(d)),
            # Clients ping every 5 s while a call is open (client/cluster.py HUNG_PEER_OPTIONS) to notice a
            # frozen broker: accept that (gRPC's default is one ping without data per 5 minutes); a
            # faster pinger is still sent GOAWAY after gRPC's two strikes.
            ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
            # A connection with no call open for connections.max.idle.ms is sent GOAWAY and closed, as
            # Kafka closes an idle one (a client reconnects on its next call).
            ("grpc.max_connection_idle_ms", int(d.get("connections.max.idle.ms", str(DEFAULT_CONNECTION_IDLE_MS)))),
            ("grpc.so_reuseport", 0)])

    def _make_receive_gate(self, d: dict[str, str]) -> ReceiveGate:
        total = int(d.get("max.receiving.requests", str(DEFAULT_RECEIVING)))
        per_client = int(d.get("max.receiving.requests.per.ip", str(DEFAULT_RECEIVING_PER_CLIENT)))
        assert self._security_pool is not None
        streams_per_client = int(d.get("max.request.streams.per.ip", str(DEFAULT_STREAMS_PER_CLIENT)))
        streams = {
            "/brook.BrokerService/ProduceStream": StreamCounts(
                "ProduceStream", streams_per_client, int(d.get("max.produce.streams", str(DEFAULT_PRODUCE_STREAMS)))),
            "/brook.BrokerService/FetchStream": StreamCounts(
                "FetchStream", streams_per_client, int(d.get("max.fetch.streams", str(DEFAULT_FETCH_STREAMS))),
                total_key="max.fetch.streams"),
            # Followers' streams: one per follower broker and fetcher. Refused unread unless the caller
            # is a node, so bounded in all by the nodes' addresses.
            "/brook.BrokerService/ReplicaFetch": StreamCounts("ReplicaFetch", streams_per_client, nodes_only=True),
            # Server reflection (grpcurl): rarely more than one at a time.
            OTHER_STREAMS: StreamCounts("other request", streams_per_client, OTHER_STREAMS_TOTAL, total_key=None),
        }
        return ReceiveGate(
            ReceiveSlots(total, per_client), streams,
            int(d.get("request.receive.timeout.ms", str(DEFAULT_RECEIVE_TIMEOUT_MS))) / 1000, self._security_pool,
            replication_slots=ReceiveSlots(total, per_client), cpu=self.capacity.cpu,
            replication_methods=frozenset({"/brook.BrokerService/OffsetsForLeaderEpoch"}))

    def receive_stats(self) -> ReceiveStats:
        return ReceiveStats.of(self.receive_gate) if self.receive_gate is not None else ReceiveStats()

    @staticmethod
    def _streams_per_connection(d: dict[str, str]) -> int:
        """``max.streams.per.connection``, at most ``max.inflight.requests.per.ip``."""
        return min(int(d.get("max.streams.per.connection", str(DEFAULT_STREAMS_PER_CONNECTION))),
                   int(d.get("max.inflight.requests.per.ip", "2000")))

    def _max_connections(self, d: dict[str, str]) -> int:
        """``max.connections``, kept below half the process's file-descriptor limit (the rest is for logs)."""
        return connections_within_descriptors(int(d.get("max.connections", str(DEFAULT_MAX_CONNECTIONS))), 2,
                                              f"broker {self.node_id}")

    def _stop_loop(self) -> None:
        if self.loop_monitor is not None:
            self.loop_monitor.stop()  # first: a loop stopped on purpose is not a stall
        if self.loop is not None and self._loop_thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._loop_thread.join(timeout=5)
        if self.capacity is not None:
            self.capacity.io.shutdown(wait=False, cancel_futures=True)
            self.capacity.replication.shutdown(wait=False, cancel_futures=True)
            if self.capacity.recompression is not None:
                self.capacity.recompression.shutdown(wait=False, cancel_futures=True)
        if self._security_pool is not None:
            self._security_pool.shutdown(wait=False, cancel_futures=True)

    def _bind_listeners(self, server: Any) -> list[int]:
        """Open BROKER and every extra gRPC listener on ``server`` (plaintext, SSL or mTLS per listener);
        the ports bound."""
        s = self.settings
        bound = bind_port(server, s.host, s.port, s.tls)
        if bound == 0:
            raise OSError(f"broker {s.node_id}: cannot listen on {s.host}:{s.port}")
        self.port = bound
        ports = [bound]
        self.certificate_check.watch(bound, s.tls)
        for lst in s.extra_listeners:
            if lst.wire != "grpc":
                continue
            if (port := bind_port(server, lst.host, lst.port, lst.tls)) == 0:
                raise OSError(f"broker {s.node_id}: cannot listen on {lst.name} {lst.host}:{lst.port}")
            ports.append(port)
            self.certificate_check.watch(port, lst.tls)
        return ports

    def _start_replication_listener(self, service: BrokerService) -> None:
        for lst in self.settings.extra_listeners:
            if lst.wire != "replication":
                continue
            # Followers always show their node certificate here, whatever ssl.client.auth says.
            listener = ReplicationListener(service, self.node_id, lst.host, lst.port,
                                           _listener_ssl_context(lst, client_auth_required=True),
                                           self.settings.defaults, self._connection_trust(lst, True))
            self._on_loop(listener.start())
            self.replication_listener = listener

    def _start_kafka_listeners_on_metadata(self) -> None:
        while not self._stopping.is_set():
            if self.metadata_cache.wait_for(lambda c: c.version > 0, 1.0):
                log.info("broker %d: first metadata received; opening the Kafka listeners", self.node_id)
                self._start_kafka_listeners()
                return

    def _start_kafka_listeners(self) -> None:
        """Open every Kafka-protocol listener on the broker's loop (after the servicers they call exist)."""
        from broker.kafka_wire.server import KafkaListener, KafkaListenerSpec

        with self._kafka_listeners_lock:  # not while stop() closes them
            if self._stopping.is_set():
                return
            for lst in self.settings.extra_listeners:
                if lst.wire != "kafka":
                    continue
                required = lst.tls is not None and lst.tls.client_auth == "required"
                ctx = _listener_ssl_context(lst, client_auth_required=required)
                listener = KafkaListener(self, KafkaListenerSpec(lst.name, lst.host, lst.port, lst.protocol, ctx,
                                                                 self._connections_per_ip,
                                                                 self._connection_trust(lst, required)),
                                         self.settings.defaults)
                self._on_loop(listener.start())
                self.kafka_listeners.append(listener)

    def _connection_trust(self, lst: ListenerSpec, client_auth_required: bool) -> ConnectionTrust | None:
        """The CA bundle an asyncio TLS listener checks its open connections against, if it requires client
        certificates."""
        if lst.tls is None or lst.tls.ca is None or not client_auth_required:
            return None
        return ConnectionTrust(TrustAnchors(lst.tls.ca, f"broker {self.node_id} listener {lst.name}"),
                               self.security.certificate_revoked)

    def listener_by_tls(self) -> dict[bool, str]:
        """Listener whose addresses Metadata gives to a TLS / plaintext caller: BROKER first, then the rest."""
        s = self.settings
        out = {s.tls is not None: "BROKER"}
        for lst in s.extra_listeners:
            if lst.wire != "grpc":
                continue
            out.setdefault(lst.tls is not None, lst.name)
        return out

    def endpoints(self) -> list[common_pb2.Endpoint]:
        """What this broker registers: each listener's advertised address, BROKER first."""
        s = self.settings
        host, port = s.advertised or (s.host, self.port)
        out = [common_pb2.Endpoint(name="BROKER", host=host, port=port or self.port)]
        for lst in s.extra_listeners:
            port = lst.port
            if lst.wire == "replication" and self.replication_listener is not None:
                port = self.replication_listener.port  # bound to port 0: the one it got
            ad_host, ad_port = lst.advertised or (lst.host, port)
            out.append(common_pb2.Endpoint(name=lst.name, host=ad_host, port=ad_port))
        return out

    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=fn, name=f"{name}-{self.node_id}", daemon=True)
        t.start()
        self._threads.append(t)

    def partition_capacity(self) -> int:
        """Most partition replicas this broker takes (reported when it registers; 0 = unbounded): its
        descriptor limit / 12 (storage/fd_budget.py), lowered by ``max.partitions.per.broker``."""
        return partition_capacity(int(self.settings.defaults.get("max.partitions.per.broker", "0") or 0))

    def _register(self, timeout_s: float) -> None:
        s = self.settings
        req = controller_pb2.RegisterBrokerRequest(
            node_id=s.node_id, incarnation_id=self.incarnation_id, rack=s.rack, cluster_id=s.cluster_id,
            endpoints=self.endpoints(), previous_incarnation_id=self.previous_incarnation_id,
            partition_capacity=self.partition_capacity(), storage_created=self.storage_created,
            supported_metadata_level=features.SUPPORTED_MAX)
        deadline = time.monotonic() + timeout_s
        while not self._stopping.is_set():
            try:
                resp = self.controller_client.call("RegisterBroker", req, timeout_s=max(1.0, deadline - time.monotonic()))
                self.broker_epoch = resp.broker_epoch
                self._last_heartbeat_ok = time.monotonic()
                log.info("broker %d registered with epoch %d%s", s.node_id, self.broker_epoch,
                         " (its log directories are new: it left every ISR)" if self.storage_created else "")
                if self.storage_created:  # the controller has it: a later start is a normal restart
                    storage_registered([Path(d) for d in s.log_dirs])
                return
            except errors.BrookError as e:
                if time.monotonic() >= deadline:
                    raise
                if e.code in (ErrorCode.DUPLICATE_BROKER_REGISTRATION, ErrorCode.UNSUPPORTED_VERSION):
                    log.error("broker %d: the controller refuses this registration (%s): %s; retrying until %.0fs "
                              "have passed", s.node_id, e.name, e.message, timeout_s)
                    self._stopping.wait(DUPLICATE_RETRY_S)
                    continue
                log.warning("broker %d: registration failed (%s); retrying", s.node_id, e)
                self._stopping.wait(0.5)

    # ---- background loops ----
    def _watch_loop(self) -> None:
        assert self.replica_manager is not None
        while not self._stopping.is_set():
            try:
                for update in self.controller_client.watch(self.metadata_cache.version, broker_id=self.node_id):
                    with self._metadata_lock:
                        delta = self.metadata_cache.apply(update)
                        self.replica_manager.apply_metadata_delta(delta)
                    me = self.metadata_cache.broker(self.node_id)
                    if me is not None and me.broker_epoch == self.broker_epoch:
                        self.fenced = me.fenced
                    if self._stopping.is_set():
                        return
            except errors.BrookError as e:
                if self._stopping.is_set():
                    return
                log.warning("broker %d: metadata watch ended (%s); resubscribing", self.node_id, e)
            except Exception:
                if self._stopping.is_set():
                    return
                log.exception("broker %d: metadata watch failed; resubscribing", self.node_id)
            self._stopping.wait(0.2)

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(self.heartbeat_interval_ms / 1000):
            self.heartbeat_once()

    def _loop_silent_s(self) -> float:
        monitor = self.loop_monitor
        return time.monotonic() - monitor.last_beat if monitor is not None else 0.0

    def _loop_stuck(self) -> bool:
        """The event loop has not run for ``event.loop.stall.fence.ms``. Every produce, fetch and follower
        fetch of this broker waits on it, but heartbeats come from their own thread: a broker whose loop is
        stuck (an append waiting in the kernel on a hung disk, a deadlock) would keep its session, and its
        leaderships, for as long as that lasts, and no write to those partitions would be taken (the ISR
        cannot shrink either: the leader does that, on the loop). So it stops heartbeating: the controller
        fences it after broker.session.timeout.ms and elects other in-sync replicas, which hold every
        acknowledged record. Once the loop runs again the broker heartbeats, follows the new leaders
        (truncating what it alone had) and is unfenced as it catches up."""
        if self.stall_fence_s <= 0 or self._loop_silent_s() < self.stall_fence_s:
            return False
        # This thread may run before the loop's probe after the whole process was paused (SIGSTOP, a VM
        # freeze): give the probe a moment before believing the loop stuck.
        self._stopping.wait(0.2)
        return self._loop_silent_s() >= self.stall_fence_s

    def heartbeat_once(self) -> None:
        if self._loop_stuck():
            if not self._withholding_heartbeats:
                self._withholding_heartbeats = True
                log.error("broker %d: event loop has not run for %.1f s (event.loop.stall.fence.ms %d; its stack is "
                          "logged above): not heartbeating, so that the controller fences this broker and moves its "
                          "leaderships to in-sync replicas", self.node_id, self._loop_silent_s(),
                          round(self.stall_fence_s * 1000))
            return
        if self._withholding_heartbeats:
            self._withholding_heartbeats = False
            log.warning("broker %d: event loop runs again; heartbeating again", self.node_id)
        req = controller_pb2.BrokerHeartbeatRequest(
            node_id=self.node_id, broker_epoch=self.broker_epoch,
            current_metadata_version=self.metadata_cache.version, want_shutdown=self._want_shutdown,
            supported_metadata_level=features.SUPPORTED_MAX)
        try:
            resp = self.controller_client.call("BrokerHeartbeat", req,
                                               timeout_s=max(0.5, self.heartbeat_interval_ms / 1000))
        except errors.BrookError as e:
            if e.code in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
                log.warning("broker %d: controller forgot epoch %d (%s); registering again", self.node_id,
                            self.broker_epoch, e.name)
                try:
                    self._register(self.session_timeout_ms / 1000)
                except errors.BrookError as e2:
                    log.warning("broker %d: re-registration failed: %s", self.node_id, e2)
            elif not self._stopping.is_set():
                log.info("broker %d: heartbeat failed: %s", self.node_id, e)
            return
        self._last_heartbeat_ok = time.monotonic()
        if self.fenced != resp.is_fenced:
            log.info("broker %d is now %s", self.node_id, "fenced" if resp.is_fenced else "unfenced")
        self.fenced = resp.is_fenced
        if resp.should_shutdown:
            self._should_shutdown.set()

    # ---- stop ----
    def stop(self, controlled: bool = True) -> None:
        if self._stopping.is_set():
            return
        d = self.settings.defaults
        enabled = d.get("controlled.shutdown.enable", "true").strip().lower() == "true"
        if controlled and enabled and self._started and self.broker_epoch >= 0:
            timeout_ms = int(d.get("controlled.shutdown.timeout.ms", str(int(CONTROLLED_SHUTDOWN_TIMEOUT_S * 1000))))
            self._controlled_shutdown(timeout_ms / 1000)
        self._stopping.set()
        for ext in self.extension_objects:  # e.g. the group coordinator: answer waiting joins, stop timers
            stop_ext = getattr(ext, "stop", None)
            if callable(stop_ext):
                try:
                    stop_ext()
                except Exception:
                    log.exception("broker %d: stopping extension %r failed", self.node_id, ext)
        if self.replication_listener is not None:
            try:
                self._on_loop(self.replication_listener.stop(), timeout_s=5)
            except Exception:
                log.exception("broker %d: stopping the replication listener failed", self.node_id)
        with self._kafka_listeners_lock:
            for kl in self.kafka_listeners:
                try:
                    self._on_loop(kl.stop(), timeout_s=5)
                except Exception:
                    log.exception("broker %d: stopping Kafka listener %s failed", self.node_id, kl.spec.name)
        if self.connections_per_ip is not None:
            self.connections_per_ip.stop()
        if self.grpc_server is not None and self.loop is not None:
            try:
                self._on_loop(self.grpc_server.stop(grace=SERVER_STOP_GRACE_S), timeout_s=SERVER_STOP_GRACE_S + 5)
            except Exception:
                log.exception("broker %d: stopping the gRPC server failed", self.node_id)
        if self.controller_client is not None:
            self.controller_client.close()
        if self.replica_manager is not None:
            self.replica_manager.shutdown()
        for t in self._threads:
            t.join(timeout=5)
        self._stop_loop()
        if self.log_manager is not None:
            self.log_manager.shutdown()
        self.security.close()
        log.info("broker %d stopped", self.node_id)

    def _controlled_shutdown(self, timeout_s: float) -> None:
        """Ask the controller to move our leaderships away before we stop serving (bounded)."""
        self._want_shutdown = True
        deadline = time.monotonic() + timeout_s
        req = controller_pb2.ControlledShutdownRequest(node_id=self.node_id, broker_epoch=self.broker_epoch)
        quorum_lost_at: float | None = None
        if self.quorum_reachable is not None:
            reachable, lost = self.quorum_reachable, "this node's controller has reached no majority of the voters"
        else:
            reachable, lost = self._controllers_have_a_leader, "no controller has answered with a leader known"
        while time.monotonic() < deadline and not self._should_shutdown.is_set():
            if reachable():
                quorum_lost_at = None
            elif quorum_lost_at is None:
                quorum_lost_at = time.monotonic()
            elif time.monotonic() - quorum_lost_at >= NO_QUORUM_GIVE_UP_S:
                log.warning("broker %d: controlled shutdown given up: %s for %.0f s, so no controller can move "
                            "our leaderships (were the controllers stopped first?); stopping anyway",
                            self.node_id, lost, time.monotonic() - quorum_lost_at)
                return
            try:
                # Each attempt bounded, so that the loop looks at the quorum (and the deadline) between them;
                # asking again is harmless (the controller answers what is left to move).
                resp = self.controller_client.call("ControlledShutdown", req, timeout_s=max(
                    0.5, min(NO_QUORUM_GIVE_UP_S, deadline - time.monotonic())))
                if resp.remaining_leaderships == 0:
                    log.info("broker %d: controlled shutdown complete", self.node_id)
                    return
            except errors.BrookError as e:
                log.warning("broker %d: controlled shutdown request failed: %s", self.node_id, e)
            self.heartbeat_once()
            self._should_shutdown.wait(0.2)
        if not self._should_shutdown.is_set():
            log.warning("broker %d: controlled shutdown did not finish in %.0fs; stopping anyway",
                        self.node_id, timeout_s)

    def _controllers_have_a_leader(self) -> bool:
        """A broker-only node's view of the quorum: does a controller answer (any voter, DescribeQuorum)
        as the active one, or knowing a leader while it reaches a majority? Not when every one refuses,
        times out, or reaches no majority (a voter cut off from the others keeps naming the leader it
        lost: pysyncobj starts no election while it is connected to nobody)."""
        try:
            r = self.controller_client.describe_quorum(timeout_s=QUORUM_PROBE_TIMEOUT_S)
        except errors.BrookError:
            return False
        return not r.responder_lacks_quorum and (r.responder_is_active or r.leader_id >= 0)

    # ---- stats ----
    def stats(self) -> BrokerStats:
        rm = self.replica_manager
        parts = rm.hosted_partitions() if rm is not None else []
        return BrokerStats(self.node_id, self.broker_epoch, self.broker_epoch >= 0, self.fenced, self.lease_valid(),
                           self.metadata_cache.version, len(parts), sum(1 for p in parts if p.is_leader),
                           sum(1 for p in parts if p.role.value == "follower"),
                           rm.fetchers.fetcher_count() if rm is not None else 0)


def _listener_ssl_context(lst: ListenerSpec, *, client_auth_required: bool) -> Any:
    """The TLS server context of an asyncio listener (Kafka, replication), certificates re-read when they
    change; None for a plaintext one."""
    if lst.tls is None:
        return None
    from broker.kafka_wire.server import server_ssl_context

    return server_ssl_context(str(lst.tls.cert), str(lst.tls.key), str(lst.tls.ca) if lst.tls.ca is not None else None,
                              client_auth_required)
