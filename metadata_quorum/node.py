"""ControllerNode: one controller voter, as ``brook-server`` runs it.

It joins the Raft quorum (pysyncobj on ``raft_port``), serves ``ControllerService``
on ``grpc_port``, and runs the active controller's periodic work (session leases,
activation after an election, preferred-leader rebalancing) on a thread of its own.

Data directory layout (``data_dir``):
- ``meta.properties``: cluster.id and node.id; a mismatch refuses to start, so a
  controller never joins another cluster's quorum with its old journal;
- ``quorum.journal``: pysyncobj's Raft journal (every entry, term and vote);
- ``quorum.snapshot``: the full dump written at log compaction (the metadata snapshot).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from broker import principal
from broker.admission import DEFAULT_CONNECTION_IDLE_MS, ConnectionsPerIp, connections_within_descriptors
from broker.authorizer import AuthorizerConfig
from broker.cert_revocation import CertificateInterceptor, GrpcCertificateCheck
from broker.grpc_connections import PerAddressConnections
from broker.receiving import DEFAULT_REQUEST_MAX_BYTES, SyncReceiveGate
from broker.request_times import LatencyHistogram
from broker.tls import HANDSHAKE_TIMEOUT_MS, ServerTls, bind_port
from metadata_quorum import features
from metadata_quorum.controller import ControllerConfig, QuorumController
from metadata_quorum.raft import DUMP_FILE, MetadataRaft, RaftTiming
from metadata_quorum.service import ControllerService
from metadata_quorum.state import DEFAULT_CHANGELOG_MAX_KEYS
from proto import common_pb2, errors
from proto import controller_pb2 as pb
from proto import controller_pb2_grpc as pb_grpc
from storage import meta_properties

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.1
VOTER_PROBE_TIMEOUT_S = 2.0  # asking a voter which feature levels its release supports
GRPC_MAX_WORKERS = 96  # watch streams hold a worker each; MAX_WATCHERS of them at most
MAX_STREAMS_PER_CONNECTION = 100
_SERVER_OPTIONS = [
    ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    # Clients ping every 5 s so a frozen controller is noticed; allow it (one a second at most: a
    # client pinging faster is sent GOAWAY after gRPC's default two strikes, not answered forever).
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    # A call not yet taken by a worker is granted HTTP/2's initial 64 KiB window only (BDP probing
    # would grow it to megabytes): its message stays with the client until a worker reads it.
    ("grpc.http2.bdp_probe", 0),
    # Streams one connection may have open (HTTP/2's recommended floor; a broker or admin client uses a
    # few). A stream reset before a worker took it counts until it has (gRPC's rapid-reset defence,
    # CVE-2023-44487): unbounded, one connection resetting calls as fast as it could held other
    # clients' DescribeCluster 435 ms (p50) and had a third to half of them cancelled by gRPC's backlog
    # shedding (tests/broker/test_rapid_reset.py).
    ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
    # A connection with no call open for 10 minutes is sent GOAWAY and closed (Kafka's default
    # connections.max.idle.ms); a broker keeps its watch stream open, an admin client reconnects.
    ("grpc.max_connection_idle_ms", DEFAULT_CONNECTION_IDLE_MS),
]


# The controller port's share of the file-descriptor limit (max.connections lowered to it): its clients
# are the brokers and admin tools, a few connections each. Before, the port had no bound at all: a flood
# of connections that never shook hands (each held 10 s, HANDSHAKE_TIMEOUT_MS) or plaintext HTTP/2
# connections left idle (held connections.max.idle.ms) took one descriptor and ~45 KiB each, 3,000 of
# them 3,000 descriptors and 140 MB, until the process (on a combined node, the partition logs and the
# broker port too) ran out of descriptors.
CONTROLLER_CONNECTIONS_SHARE = 8
DEFAULT_MAX_CONNECTIONS = 10_000  # max.connections' default (broker/config.py)


def max_connections(node_id: int, defaults: dict[str, str]) -> int:
    """Connections the controller's gRPC port accepts at once: ``max.connections`` (the key, and default, of
    the broker's port), at most 1/CONTROLLER_CONNECTIONS_SHARE of the descriptor limit; more are refused
    at accept."""
    return connections_within_descriptors(int(defaults.get("max.connections", str(DEFAULT_MAX_CONNECTIONS))),
                                          CONTROLLER_CONNECTIONS_SHARE, f"controller {node_id}")


def max_request_bytes(defaults: dict[str, str]) -> int:
    """The largest request message the controller's server reads: ``socket.request.max.bytes`` (the same key,
    and default, as a broker's gRPC server and Kafka listener).

    A broker forwards Kafka admin requests (CreateTopics, ElectLeaders, ACLs, configs...) read from frames of
    up to its ``socket.request.max.bytes``; with gRPC's default 4 MiB a forwarded request of 4-8 MiB could
    never succeed, and was refused before any check ran (audit). A forwarded request whose protobuf is still
    larger is refused RESOURCE_EXHAUSTED "larger than max", which ControllerClient answers at once as
    MESSAGE_TOO_LARGE (the same request would be refused again)."""
    return int(defaults.get("socket.request.max.bytes", str(DEFAULT_REQUEST_MAX_BYTES)))


# Calls the controller's server holds at once (running, or queued for a worker: each of those holds
# at most 64 KiB of its message); more are refused RESOURCE_EXHAUSTED, so a flood of calls cannot
# queue without bound. Far above what brokers and admins need (MAX_WATCHERS streams plus requests).
MAX_CONCURRENT_RPCS = 1024
# Messages one client address may have being received at once (each holds a worker while it
# comes; more are refused RESOURCE_EXHAUSTED, which the controller client retries), and how long a
# message may take to come before its call is cancelled (controller requests are small: a broker's
# arrive in microseconds, a forwarded one of socket.request.max.bytes in milliseconds on a LAN). See
# broker/receiving.py SyncReceiveGate.
RECEIVING_PER_CLIENT = 16
RECEIVE_TIMEOUT_S = 5.0
# Workers other clients' calls may not take: kept for the nodes' own calls (heartbeats, metadata
# watches, AlterPartition) and the super users' (admins), so clients holding workers (six addresses
# at their 16 trickling messages, or slow calls) cannot starve brokers' heartbeats and get them
# fenced, nor lock an operator out. Both are known by certificate (or SCRAM session, or the loopback
# trust of a plaintext single-host cluster) before a byte of the message is read.
RESERVED_FOR_NODES = 16


def nodes_and_super_users(defaults: dict[str, str]) -> Callable[[Any], bool]:
    """Whether a call may take the workers kept from clients: a node's, or a ``super.users`` principal's
    (with an authorizer; without one there are no super users to tell apart)."""
    config = AuthorizerConfig.from_defaults(defaults)
    supers = config.super_users if config.enabled else frozenset()

    def kept_for(context: Any) -> bool:
        auth = principal.authenticate(context)
        return principal.is_node_auth(auth) or str(auth.principal) in supers
    return kept_for


@dataclass(frozen=True)
class VoterAddress:
    host: str
    grpc_port: int
    raft_port: int

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"


def parse_voters(text: str) -> dict[int, VoterAddress]:
    """Parse ``controller.quorum.voters``: ``id@host:grpc_port:raft_port,...``."""
    voters: dict[int, VoterAddress] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            node, address = part.split("@", 1)
            host, grpc_port, raft_port = address.rsplit(":", 2)
            voters[int(node)] = VoterAddress(host, int(grpc_port), int(raft_port))
        except ValueError:
            raise errors.InvalidConfigError(
                f"controller.quorum.voters entry '{part}' is not id@host:grpc_port:raft_port") from None
    if not voters:
        raise errors.InvalidConfigError("controller.quorum.voters is empty")
    return voters


@dataclass
class ControllerSettings:
    node_id: int
    voters: dict[int, VoterAddress]
    data_dir: Path
    cluster_id: str
    password: str | None
    tls: ServerTls | None = None  # the CONTROLLER listener's TLS (mTLS when client auth is required)
    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    defaults: dict[str, str] = field(default_factory=dict)
    request_timeout_ms: int = 30000
    raft_timing: RaftTiming = field(default_factory=RaftTiming)
    # How many changed-entity keys WatchMetadata can serve as deltas; older watchers get a snapshot.
    metadata_changelog_max_keys: int = DEFAULT_CHANGELOG_MAX_KEYS
    # client.security.SecurityConfig reaching the other voters' CONTROLLER listener (None: plaintext), to ask
    # which brook.metadata.version their release supports before the level is raised.
    peer_security: Any = None


@dataclass(frozen=True)
class ControllerStats:
    is_active: bool
    leader_id: int
    term: int
    commit_index: int
    last_applied: int
    metadata_version: int
    fenced_brokers: int
    offline_partitions: int
    brokers: int
    topics: int
    partitions: int
    raft_tick_gaps: LatencyHistogram | None = None  # the Raft tick thread's gaps (None before the start)
    raft_tick_stalls: int = 0
    pre_vote_rounds: int = 0  # pre-vote rounds this voter ran (metadata_quorum/prevote.py) ...
    pre_vote_rounds_won: int = 0  # ... and those a majority granted
    receive_refused: int = 0  # calls refused: their address had RECEIVING_PER_CLIENT messages coming
    receive_cancelled: int = 0  # calls cancelled: their message did not come within RECEIVE_TIMEOUT_S
    client_calls_refused: int = 0  # clients' calls refused: only the workers kept for nodes were free
    calls_served: int = 0  # calls whose handler runs (each holds a worker of GRPC_MAX_WORKERS)
    # Controller mutation quota (KIP-599), partitions: refused (strict) / accepted over it (permissive).
    mutations_throttled: int = 0
    mutations_over_quota: int = 0
    raft_journal_flushes: LatencyHistogram | None = None  # the Raft journal's flush times (None: not on disk)
    raft_connections_refused: int = 0  # quorum-port callers closed for what they said they were
    # Times the active controller heard no broker and asked the other voters: it handed over, or fenced them.
    cut_off_handed_over: int = 0
    cut_off_fenced: int = 0


class VoterLevels:
    """The voters' supported feature levels, asked of all of them at once (each at most VOTER_PROBE_TIMEOUT_S), one
    round at a time, and kept. A caller that can take an old answer (DescribeFeatures) gets the last round's at
    once, and starts a new round in the background when it is older than ``max_age_s``; only the first caller,
    and one that needs a fresh answer (UpdateFeatures: ``max_age_s`` 0), waits for a round, shared with the callers
    waiting at the same moment. Before, each DescribeFeatures asked every voter in turn, 5 s for a stopped one: 200
    callers held the controller's workers until brokers' heartbeats went unanswered and all three were fenced (23 s
    without an acknowledged write; audit); then, waiting for each new round, they delayed heartbeats for 2 s every
    10 s."""

    def __init__(self, probe: Callable[[int], tuple[int, str]], voters: list[int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self._voters = list(voters)
        self._clock = clock
        self._cond = threading.Condition()
        self._levels: dict[int, tuple[int, str]] | None = None
        self._at = float("-inf")  # when the last round ended
        self._asking = False

    def get(self, max_age_s: float, *, stale_ok: bool = False) -> dict[int, tuple[int, str]]:
        asked_at = self._clock()
        with self._cond:
            while True:
                fresh = self._levels is not None and self._at >= asked_at - max_age_s
                if fresh or (stale_ok and self._levels is not None):
                    levels = dict(self._levels or {})
                    if not fresh and not self._asking:
                        self._asking = True
                        threading.Thread(target=self._round, name="voter-levels", daemon=True).start()
                    return levels
                if not self._asking:
                    self._asking = True
                    break
                self._cond.wait(VOTER_PROBE_TIMEOUT_S + 1.0)
        return self._round()

    def _round(self) -> dict[int, tuple[int, str]]:
        """Ask every voter at once; the caller has set ``_asking``."""
        levels: dict[int, tuple[int, str]] = {}
        try:
            with futures.ThreadPoolExecutor(max_workers=len(self._voters), thread_name_prefix="voter-levels") as pool:
                for node_id, answer in zip(self._voters, pool.map(self._probe, self._voters), strict=True):
                    levels[node_id] = answer
        finally:
            with self._cond:
                if levels:
                    self._levels, self._at = levels, self._clock()
                self._asking = False
                self._cond.notify_all()
        return dict(levels)


class ControllerNode:
    def __init__(self, settings: ControllerSettings) -> None:
        if settings.node_id not in settings.voters:
            raise errors.InvalidConfigError(
                f"node.id {settings.node_id} is not among controller.quorum.voters {sorted(settings.voters)}")
        self.settings = settings
        self._raft: MetadataRaft | None = None
        self._controller: QuorumController | None = None
        self._voter_levels: VoterLevels | None = None
        self._service: ControllerService | None = None
        self._server: grpc.Server | None = None
        self.connections_per_ip: PerAddressConnections | None = None  # max.connections.per.ip on the port
        self._receive_gate = SyncReceiveGate(RECEIVING_PER_CLIENT, RECEIVE_TIMEOUT_S, f"controller-{settings.node_id}",
                                             workers=GRPC_MAX_WORKERS, reserved_for_nodes=RESERVED_FOR_NODES,
                                             is_node=nodes_and_super_users(settings.defaults))
        self._security: Any = None  # broker.security.NodeSecurity, built with the gRPC server
        self._bootstrap: Any = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----
    def start(self) -> None:
        """Join the quorum and serve; returns once both ports are bound."""
        self._check_meta_properties()
        # pysyncobj's tick thread stops when the thread that built the SyncObj ends, so
        # the quorum is built on (and owned by) the node's own long-lived thread.
        self._thread = threading.Thread(target=self._run, name=f"controller-{self.settings.node_id}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            self._thread.join(timeout=5)
            raise errors.KafkaStorageError(f"controller {self.settings.node_id} failed to start: "
                                           f"{self._start_error}") from self._start_error
        self._start_grpc()
        me = self.settings.voters[self.settings.node_id]
        log.info("controller %d serving gRPC on %s:%d, quorum on %s", self.settings.node_id, me.host,
                 me.grpc_port, me.raft_address)

    def stop(self) -> None:
        if self._bootstrap is not None:
            self._bootstrap.stop()
        if self._service is not None:
            self._service.shutdown()
        if self.connections_per_ip is not None:
            self.connections_per_ip.stop()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(timeout=3.0)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._security is not None:
            self._security.close()

    def is_active(self) -> bool:
        return self._controller is not None and self._controller.is_active()

    def wait_active(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.is_active():
                return True
            time.sleep(0.02)
        return False

    @property
    def raft(self) -> MetadataRaft:
        assert self._raft is not None, "node not started"
        return self._raft

    @property
    def controller(self) -> QuorumController:
        assert self._controller is not None, "node not started"
        return self._controller

    @property
    def service(self) -> ControllerService:
        assert self._service is not None, "node not started"
        return self._service

    def snapshot_path(self) -> Path:
        return self.settings.data_dir / DUMP_FILE

    # ---- internals ----
    def _check_meta_properties(self) -> None:
        meta_properties.check_or_write(self.settings.data_dir, self.settings.cluster_id, self.settings.node_id)

    def _run(self) -> None:
        settings = self.settings
        me = settings.voters[settings.node_id]
        partners = [v.raft_address for n, v in sorted(settings.voters.items()) if n != settings.node_id]
        try:
            self._raft = MetadataRaft(me.raft_address, partners, settings.data_dir, password=settings.password,
                                      timing=settings.raft_timing,
                                      changelog_max_keys=settings.metadata_changelog_max_keys)
            self._raft.wait_bound()
            config = ControllerConfig(settings.node_id, settings.cluster_id, settings.broker_session_timeout_ms,
                                      settings.broker_heartbeat_interval_ms, settings.request_timeout_ms,
                                      dict(settings.defaults))
            self._voter_levels = VoterLevels(self._probe_voter, sorted(settings.voters))
            self._controller = QuorumController(config, self._raft, voter_levels=self._voter_levels.get,
                                                voters_hearing_brokers=self._voters_hearing_brokers if partners
                                                else None)
        except Exception as exc:  # surfaced to start()'s caller
            self._start_error = exc
            if self._raft is not None:
                self._raft.destroy()
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.wait(TICK_INTERVAL_S):
                try:
                    self._controller.tick()
                except Exception:  # keep the controller loop alive; the next tick retries
                    log.exception("controller tick failed")
        finally:
            self._raft.destroy_synchronous()

    def _start_grpc(self) -> None:
        settings = self.settings
        me = settings.voters[settings.node_id]
        voter_ids = {v.raft_address: n for n, v in settings.voters.items()}
        self._security, admin = self._build_security()
        self._certificate_check = GrpcCertificateCheck(f"controller {settings.node_id}",
                                                        self._security.certificate_revoked)
        self._service = ControllerService(self.controller, self.raft, self._redirect, cluster_id=settings.cluster_id,
                                          voter_ids=voter_ids, default_timeout_s=settings.request_timeout_ms / 1000,
                                          authorizer=self._security.authorizer)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=GRPC_MAX_WORKERS,
                                                        thread_name_prefix=f"controller-{settings.node_id}-grpc"),
                             options=[*_SERVER_OPTIONS, ("grpc.max_receive_message_length",
                                                         max_request_bytes(settings.defaults)),
                                      ("grpc.max_allowed_incoming_connections",
                                       max_connections(settings.node_id, settings.defaults))],
                             interceptors=[CertificateInterceptor(self._certificate_check), self._receive_gate,
                                           self._security.interceptor],
                             maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
        pb_grpc.add_ControllerServiceServicer_to_server(self._service, server)
        self._security.add_service(server, admin)
        bound = bind_port(server, me.host, me.grpc_port, settings.tls)
        if bound == 0:
            self._stop.set()
            raise errors.KafkaStorageError(f"cannot bind the controller gRPC port {me.host}:{me.grpc_port}")
        self._certificate_check.watch(bound, settings.tls)
        server.start()
        self._server = server
        self.connections_per_ip = PerAddressConnections(
            [bound], ConnectionsPerIp.of(settings.defaults, f"controller {settings.node_id}"),
            f"controller {settings.node_id}")
        self.connections_per_ip.start()
        self._bootstrap.start()

    def _build_security(self) -> tuple[Any, Any]:
        """SCRAM sessions and ACL checks over this controller's MetadataState; the security admin API."""
        from broker.security import node_security
        from metadata_quorum import security_service as ss

        raft = self.raft
        security = node_security(self.settings.defaults,
                                 credentials=lambda u, m: raft.read(lambda s: s.scram.get((u, m))),
                                 acls=ss.StateAclView(raft))
        admin = ss.QuorumSecurityAdmin(self.controller, raft, self._redirect, ss.parse_bootstrap_users(
            self.settings.defaults.get("scram.bootstrap.users", "")))
        self._bootstrap = ss.BootstrapThread(admin, f"controller-{self.settings.node_id}-scram-bootstrap")
        return security, admin

    def _probe_voter(self, node_id: int) -> tuple[int, str]:
        """One voter's highest supported brook.metadata.version, from its DescribeQuorum (any voter answers, from
        its own view); (0, why) when it cannot be asked. A release before feature levels does not fill it: 1."""
        if node_id == self.settings.node_id:
            return features.SUPPORTED_MAX, ""
        try:
            resp = self._describe_voter(node_id)
        except grpc.RpcError as exc:
            return 0, f"cannot be asked: {exc.code().name}: {exc.details()}"
        except errors.BrookError as exc:
            return 0, f"cannot be asked: {exc}"
        if resp.error_code:
            return 0, f"answered {errors.code_name(resp.error_code)}: {resp.error_message}"
        return resp.responder_supported_metadata_level or features.SUPPORTED_MIN, ""

    def _describe_voter(self, node_id: int) -> pb.DescribeQuorumResponse:
        """Voter ``node_id``'s DescribeQuorum from its own view (any voter answers), within VOTER_PROBE_TIMEOUT_S."""
        from client.security import make_channel

        voter = self.settings.voters[node_id]
        with make_channel(f"{voter.host}:{voter.grpc_port}", self.settings.peer_security) as channel:
            return pb_grpc.ControllerServiceStub(channel).DescribeQuorum(
                pb.DescribeQuorumRequest(any_voter=True), timeout=VOTER_PROBE_TIMEOUT_S)

    def _voters_hearing_brokers(self) -> list[str]:
        """The Raft addresses of the other voters that brokers reach (DescribeQuorum's ``responder_hears_brokers``)
        and that reach a majority of the voters, all asked at once (VOTER_PROBE_TIMEOUT_S at most)."""
        def hears(node_id: int) -> bool:
            try:
                resp = self._describe_voter(node_id)
            except (grpc.RpcError, errors.BrookError) as exc:
                log.info("voter %d cannot be asked whether brokers reach it: %s", node_id, exc)
                return False
            return not resp.error_code and resp.responder_hears_brokers and not resp.responder_lacks_quorum

        others = [n for n in sorted(self.settings.voters) if n != self.settings.node_id]
        with futures.ThreadPoolExecutor(max_workers=max(1, len(others)), thread_name_prefix="voter-probe") as pool:
            answers = list(pool.map(hears, others))
        return [self.settings.voters[n].raft_address for n, yes in zip(others, answers, strict=True) if yes]

    def _redirect(self) -> pb.ControllerRedirect:
        leader = self.raft.leader_address()
        for node_id, voter in self.settings.voters.items():
            if voter.raft_address == leader:
                return pb.ControllerRedirect(leader_id=node_id, leader=common_pb2.Endpoint(
                    name="CONTROLLER", host=voter.host, port=voter.grpc_port))
        return pb.ControllerRedirect(leader_id=-1)

    def stats(self) -> ControllerStats:
        raft = self._raft
        if raft is None or self._controller is None:  # not started (or failed to): nothing to report yet
            return ControllerStats(False, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0)

        def counts(s):  # type: ignore[no-untyped-def]
            return (s.version, sum(1 for b in s.brokers.values() if b.fenced), s.offline_partitions(),
                    len(s.brokers), len(s.topics), s.partition_count())

        version, fenced, offline, brokers, topics, partitions = raft.read(counts)
        leader = self._redirect().leader_id
        gate = self._receive_gate
        quota = self._controller.mutation_quotas.stats
        return ControllerStats(self.is_active(), leader, raft.term, raft.commit_index, raft.last_applied, version,
                               fenced, offline, brokers, topics, partitions, raft.tick_gaps, raft.tick_stalls_total,
                               *raft.pre_vote_rounds(), gate.refused_total, gate.watchdog.cancelled_total,
                               gate.workers_refused_total, gate.busy, quota.refused, quota.accepted_over_quota,
                               raft_journal_flushes=raft.journal_flushes,
                               raft_connections_refused=raft.connections_refused,
                               cut_off_handed_over=self._controller.cut_off_outcomes["handed_over"],
                               cut_off_fenced=self._controller.cut_off_outcomes["fenced"])
