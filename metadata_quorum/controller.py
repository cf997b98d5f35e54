"""QuorumController: the active controller's decisions.

Everything that needs a clock, liveness or randomness is decided here, on the Raft
leader, *before* a command is proposed: broker session leases (fence on expiry),
unfencing once a broker has caught up, controlled shutdown, topic ids and replica
placement, periodic preferred-leader elections, the controller mutation quota
(KIP-599: partitions created or deleted per second and principal, checked here for the
whole cluster). The ``MetadataState`` then applies the resulting commands
deterministically on every voter.

The controller is active only after its own ``ActivateController`` command (carrying
its Raft term) has been applied: by then the state holds every command committed by
earlier leaders, so no decision is made on stale metadata. On activation every broker
gets a fresh session lease (as Kafka does), so a failover never fences healthy
brokers that were heartbeating the previous controller.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.log_limits import ThrottledWarning
from broker.quotas import (
    DEFAULT_WINDOW_NUM,
    DEFAULT_WINDOW_SIZE_S,
    UNLIMITED,
    ControllerMutationQuotas,
    MutationQuota,
)
from metadata_quorum import cluster_configs, features
from metadata_quorum import commands as c
from metadata_quorum.cluster_configs import BROKER_DEFAULT_KEYS
from metadata_quorum.cluster_view import ClusterView
from metadata_quorum.election import NO_LEADER, can_move_to_preferred, elect_leader
from metadata_quorum.placement import BrokerLoad, place_replicas
from metadata_quorum.raft import MetadataRaft, PendingProposal
from metadata_quorum.state import (
    MAX_PARTITIONS_PER_TOPIC,
    BrokerState,
    ItemResult,
    MetadataState,
    PartitionState,
    collision_key,
    replica_room_refusal,
    validate_topic_name,
)
from proto import controller_pb2 as pb
from proto import errors
from proto.errors import ErrorCode
from storage import log_config

log = logging.getLogger(__name__)


# Limits checked before anything is proposed to Raft (a refused request costs no journal
# entry, no replication, no apply on the followers).
MAX_TOPICS_PER_REQUEST = 1000
MAX_PARTITIONS_PER_REQUEST = 100_000  # new partitions summed over a CreateTopics/CreatePartitions request
MAX_CLUSTER_PARTITIONS = 200_000  # default of max.cluster.partitions
MAX_REQUEST_ID_CHARS = 64  # CreatableTopic.request_id: a UUID fits, and the state keeps one per topic
MAX_PARTITION_CHANGES_PER_REQUEST = 10_000  # AlterPartition items
# An activation that did not commit (leadership changed under it) is proposed again, a
# few times per term at most; an activation the state refused is never proposed again.
MAX_ACTIVATION_ATTEMPTS = 3
STEP_DOWN_RETRY_S = 1.0
_ACTIVATION_TERMS_KEPT = 16
MAX_REBALANCE_MOVES_PER_ROUND = 1000
MAX_REASSIGNMENT_COMPLETIONS_IN_FLIGHT = 100  # CompleteReassignment proposals outstanding at once
PRODUCER_ID_BLOCK_SIZE = 1000
# DescribeFeatures answers with the voters' last answers, asked again in the background once older than this
# (UpdateFeatures waits for fresh ones).
DESCRIBE_FEATURES_MAX_AGE_S = 10.0
# A new cluster's first active controller finalizes initial.metadata.version: tried again every INITIAL_LEVEL_RETRY_S
# while a voter cannot be asked yet (still starting), for about INITIAL_LEVEL_DEADLINE_S at most.
INITIAL_LEVEL_DEADLINE_S = 120.0
INITIAL_LEVEL_RETRY_S = 1.0
INITIAL_LEVEL_ATTEMPT_TIMEOUT_S = 10.0
LEVEL_REFUSAL_LOG_S = 60.0  # a broker of a release below the finalized level is logged once a minute


@dataclass
class ControllerConfig:
    node_id: int
    cluster_id: str
    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    request_timeout_ms: int = 30000
    defaults: Mapping[str, str] | None = None

    def default(self, key: str, fallback: str) -> str:
        return str((self.defaults or {}).get(key, fallback))

    @property
    def leader_imbalance_check_interval_s(self) -> float:
        return float(self.default("leader.imbalance.check.interval.seconds", "300"))

    @property
    def auto_leader_rebalance_enable(self) -> bool:
        return self.default("auto.leader.rebalance.enable", "true").lower() == "true"

    @property
    def initial_metadata_version(self) -> int:
        """The brook.metadata.version a new cluster is finalized at. A node's config always has it (broker/config.py:
        default the highest level, range checked); a config made in code without it keeps level 1."""
        return int(self.default("initial.metadata.version", str(features.SUPPORTED_MIN)))

    @property
    def unclean_leader_election_default(self) -> bool:
        return self.default("unclean.leader.election.enable", "false").lower() == "true"

    def topic_default(self, name: str) -> str | None:
        """The cluster default of a topic config (node file), or None for the built-in one."""
        defaults = self.defaults or {}
        broker_key = BROKER_DEFAULT_KEYS.get(name)
        if broker_key is not None and broker_key in defaults:
            return str(defaults[broker_key])
        return str(defaults[name]) if name in defaults else None


class QuorumController:
    """Decisions of the active controller. Every public method may be called from any gRPC thread."""

    def __init__(self, config: ControllerConfig, raft: MetadataRaft,
                 clock: Callable[[], float] = time.monotonic, *,
                 rng: random.Random | None = None,
                 new_topic_id: Callable[[], str] = lambda: uuid.uuid4().hex,
                 voter_levels: Callable[..., dict[int, tuple[int, str]]] | None = None,
                 voters_hearing_brokers: Callable[[], list[str]] | None = None) -> None:
        self.config = config
        # Every voter's highest supported brook.metadata.version, or (0, why unknown): (max_age_s, stale_ok=) as
        # node.VoterLevels.get takes them (the node asks each voter's DescribeQuorum). Alone, it knows only itself.
        self._voter_levels = voter_levels or (
            lambda max_age_s, stale_ok=False: {config.node_id: (features.SUPPORTED_MAX, "")})
        # broker id -> highest level its release supports, from its registration and heartbeats (memory only: a
        # new active controller learns them within a heartbeat interval)
        self._broker_levels: dict[int, int] = {}
        self.raft = raft
        # Injected so the deterministic simulator (tests/sim) can replay a seed exactly.
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._new_topic_id = new_topic_id
        self._lock = threading.Lock()
        self._retried_creates = ThrottledWarning(log, level=logging.INFO)
        self.cluster_view = ClusterView(raft.read)  # DescribeCluster's records, kept off the state lock
        self._registering = threading.Lock()
        self._level_refusals: dict[int, float] = {}  # broker id -> when its refusal for an old release was logged
        self._list_ops_lock = threading.Lock()  # APPEND/SUBTRACT requests, one at a time (alter_configs)
        self._leases: dict[int, float] = {}  # broker id -> monotonic time of the last heartbeat
        self._last_tick_at: float | None = None  # when tick() last ran, to see this controller's own stalls
        self._active_term = -1  # the term whose activation this node has completed
        self._activating: PendingProposal | None = None
        self._activating_term = -1
        # term -> ActivateController proposals made in it (bounded: a few per term, few terms kept)
        self.activation_attempts: dict[int, int] = {}
        self._gave_up_terms: set[int] = set()  # terms whose activation was refused: never proposed again
        self._last_step_down: float | None = None
        # Hearing no broker while active (_cut_off_from_brokers): ``voters_hearing_brokers`` asks the other voters
        # (the Raft addresses of those that brokers' heartbeats reach; None: never hand over, as a single voter or
        # the simulator), in the background, and what the last asking found (when, and the voter or None).
        self._voters_hearing_brokers = voters_hearing_brokers
        # Times this controller, cut off from every broker, asked the other voters (_cut_off_from_brokers), by outcome:
        # "handed_over" (a voter heard brokers: Raft leadership was handed to it) or "fenced" (none did).
        self.cut_off_outcomes: collections.Counter[str] = collections.Counter()
        self._cut_off_asking: threading.Thread | None = None
        self._cut_off_answer: tuple[float, str | None] | None = None
        self._cut_off_step_down_at = float("-inf")  # when the tick last asked for that hand-over
        self._broker_heard_at: float | None = None  # a broker last reached this voter (note_broker_contact)
        self._fencing: dict[int, PendingProposal] = {}
        self._next_rebalance_at = 0.0
        self._rebalancing: PendingProposal | None = None
        self._completing: dict[tuple[str, int], PendingProposal] = {}  # reassignments being completed
        # Topic names proposed and not yet answered, by collision key: a name colliding with one of them is
        # refused as with an existing topic (Kafka's controller has applied the first to its in-memory state
        # when it checks the next). Read and taken with the state under one lock (``_reserve_name``).
        self._names_lock = threading.Lock()
        self._names_in_flight: dict[str, collections.Counter[str]] = {}
        # partition -> when its leader last handed leadership to another in-sync replica instead of shrinking
        # the ISR below min.insync.replicas (see _move_instead_of_shrinking), in this controller's memory only
        self._moved_instead_of_shrinking: dict[tuple[str, int], float] = {}
        # KIP-599's buckets, in this controller's memory only: a new active controller starts them full.
        self.mutation_quotas = ControllerMutationQuotas(
            lambda entity: raft.read(lambda s: s.quotas.get(entity)),
            window_num=int(config.default("quota.window.num", str(DEFAULT_WINDOW_NUM))),
            window_size_s=float(config.default("quota.window.size.seconds", str(DEFAULT_WINDOW_SIZE_S))),
            clock=clock)

    # ---- proposals: always stamped with the epoch this controller was activated in ----
    def _submit(self, cmd: c.Command) -> PendingProposal:
        epoch = self._active_term
        if epoch < 0:
            raise errors.NotControllerError("this controller is not active")
        return self.raft.submit(cmd, epoch)

    def _propose(self, cmd: c.Command, timeout_s: float) -> Any:
        return self._submit(cmd).wait(timeout_s)

    # ---- activity ----
    def is_active(self) -> bool:
        """Raft leader, and our ActivateController for the current term has been applied, and the Raft tick
        thread is running: one stuck for an election timeout (its journal on a hung disk) leaves this voter
        believing it leads while the others elect a new leader, and answering brokers' heartbeats and watches
        as the active controller, it kept them from the new one (they were all fenced there)."""
        if not self.raft.is_leader() or not self.raft.ticking():
            return False
        term = self.raft.term
        if self._active_term != term:
            return False
        return self.raft.read(lambda s: s.active_controller_id == self.config.node_id
                              and s.controller_epoch == term)

    def tick(self) -> None:
        """Called periodically by the node: activation, lease expiry, rebalancing."""
        now = self._clock()
        gap = None if self._last_tick_at is None else now - self._last_tick_at
        self._last_tick_at = now
        # One consistent (leader, term) read from pysyncobj's tick thread: the term is
        # one this node really led, so an activation stamped with it can never claim a
        # term that another voter won (the cluster-wide outage of a torn read).
        is_leader, term = self.raft.leadership()
        if not is_leader or not self.raft.is_leader():
            if self._active_term != -1:
                log.info("controller %d is no longer active", self.config.node_id)
            self._active_term = -1
            self._activating = None
            return
        if self._active_term != term:
            self._try_activate(term)
            return
        if gap is not None:
            self._forgive_own_stall(now, gap)
        self._expire_sessions()
        self._maybe_rebalance()
        self._complete_reassignments()

    def _try_activate(self, term: int) -> None:
        """Propose ActivateController for ``term`` (at most MAX_ACTIVATION_ATTEMPTS times), then
        become active once it is applied. Refused (another activation for this term or a later
        one is in the log): this node cannot lead this term, so it hands leadership over
        instead of proposing again."""
        if term in self._gave_up_terms:
            self._retry_step_down()
            return
        if self._activating is not None and self._activating_term == term:
            pending = self._activating
            try:
                outcome = pending.wait(0)
            except errors.RequestTimedOutError:
                return  # not committed yet
            except errors.BrookError as exc:  # not committed (leadership changed, queue full)
                log.info("activation for term %d failed: %s", term, exc)
                self._activating = None
                return
            self._activating = None
            applied = self.raft.read(lambda s: (s.active_controller_id, s.controller_epoch))
            if not outcome.ok or applied != (self.config.node_id, term):
                log.error("controller %d: activation for term %d refused (%s; metadata says controller %d, "
                          "epoch %d); stepping down so a new election can activate a controller",
                          self.config.node_id, term, outcome.error_message or "superseded", applied[0], applied[1])
                self._give_up_term(term)
                return
            now = self._clock()
            with self._lock:
                brokers = self.raft.read(lambda s: list(s.brokers))
                self._leases = {b: now for b in brokers}
                self._broker_levels.clear()  # what brokers report to this activation only
                self._fencing.clear()
            self._next_rebalance_at = now + self.config.leader_imbalance_check_interval_s
            self._active_term = term
            log.info("controller %d is active (term %d, metadata version %d)", self.config.node_id, term,
                     self.raft.version)
            # The first activation the cluster ever had: known from the epoch its own apply replaced, once every
            # entry before it was applied. Read when it was proposed, a leader just restarted could see epoch 0
            # before replaying the log it had, and raise an existing cluster's level (CI caught it).
            if outcome.value == 0:
                threading.Thread(target=self._finalize_initial_level, args=(term,), daemon=True,
                                 name="initial-metadata-version").start()
            elif (level := self.raft.read(lambda s: s.metadata_level)) < features.SUPPORTED_MAX:
                # After a rolling upgrade (or a new cluster whose first controller stopped before it finalized its
                # level): the operator decides, and needs to know there is something to decide.
                log.info("%s is %d; this release supports up to %d: once every node runs a release that supports "
                         "it (and no roll back is planned), run `brook features upgrade --level %d`",
                         features.METADATA_VERSION, level, features.SUPPORTED_MAX, features.SUPPORTED_MAX)
            return
        attempts = self.activation_attempts.get(term, 0)
        if attempts >= MAX_ACTIVATION_ATTEMPTS:
            log.error("controller %d: %d activation attempts for term %d did not commit; stepping down",
                      self.config.node_id, attempts, term)
            self._give_up_term(term)
            return
        if len(self.activation_attempts) >= _ACTIVATION_TERMS_KEPT:
            self.activation_attempts.pop(next(iter(self.activation_attempts)))
        self.activation_attempts[term] = attempts + 1
        self._activating_term = term
        self._activating = self.raft.submit(c.ActivateController(
            self.config.node_id, term, self.config.unclean_leader_election_default))

    def _finalize_initial_level(self, term: int) -> None:
        """A new cluster starts at ``initial.metadata.version`` (default: the highest level of this release), as Kafka
        formats a new cluster at its release's metadata.version: a cluster made by this release has nothing an older
        one wrote. The first controller ever active finalizes it as ``brook features upgrade`` does, once every
        voter (and any broker registered meanwhile) supports it; voters still starting are asked again for up to
        INITIAL_LEVEL_DEADLINE_S. A node that answers with a lower level (an older release) ends it at once: the
        cluster is then one an operator upgrades, and must not be raised when that node is rolled forward later
        (audit: a mixed-release cluster rolled within the retry window was raised, and the roll back then failed).
        A later controller never does: an existing cluster is raised by its operator."""
        level = self.config.initial_metadata_version
        # A wall-clock bound (each round may wait 2 s for a hung voter): audit saw 120 rounds last 360 s.
        deadline = time.monotonic() + INITIAL_LEVEL_DEADLINE_S
        for _ in range(int(INITIAL_LEVEL_DEADLINE_S / INITIAL_LEVEL_RETRY_S)):
            if self._active_term != term:
                return  # no longer active: the level is not this controller's to set
            current = self.raft.read(lambda s: s.metadata_level)
            if current >= level:
                return  # nothing to do (initial.metadata.version 1), or an operator was first
            try:
                self.update_features(pb.UpdateFeaturesRequest(name=features.METADATA_VERSION, level=level),
                                     INITIAL_LEVEL_ATTEMPT_TIMEOUT_S)
            except errors.BrookError as exc:
                problem = exc.message
            else:
                log.info("new cluster: %s finalized at %d (initial.metadata.version)", features.METADATA_VERSION,
                         level)
                return
            # Why not, from the levels the attempt just learned (kept answers: no second round of questions).
            older = [f"{n.role} {n.node_id} (supports up to {n.supported_max})"
                     for n in self._node_levels(DESCRIBE_FEATURES_MAX_AGE_S, stale_ok=True)
                     if 0 < n.supported_max < level]
            if older:
                log.warning("new cluster: %s stays at %d, not the initial.metadata.version %d: nodes of an older "
                            "release: %s. Once every node runs this release, raise it with `brook features upgrade "
                            "--level %d`", features.METADATA_VERSION, current, level, "; ".join(older), level)
                return
            if time.monotonic() >= deadline:
                log.warning("new cluster: %s stays at %d, not the initial.metadata.version %d: in %.0f s this "
                            "controller could not learn that every node supports it (%s). Once every node runs this "
                            "release, raise it with `brook features upgrade --level %d`", features.METADATA_VERSION,
                            current, level, INITIAL_LEVEL_DEADLINE_S, problem, level)
                return
            time.sleep(INITIAL_LEVEL_RETRY_S)

    def _give_up_term(self, term: int) -> None:
        if len(self._gave_up_terms) >= _ACTIVATION_TERMS_KEPT:
            self._gave_up_terms.discard(min(self._gave_up_terms))
        self._gave_up_terms.add(term)
        self._last_step_down = None
        self._retry_step_down()

    def _retry_step_down(self) -> None:
        """Ask Raft to hand leadership over, at most once per STEP_DOWN_RETRY_S (the transfer is
        refused while no follower has caught up, so it may take a few)."""
        now = self._clock()
        if self._last_step_down is not None and now - self._last_step_down < STEP_DOWN_RETRY_S:
            return
        self._last_step_down = now
        log.warning("controller %d steps down from Raft leadership (term %d)", self.config.node_id,
                    self._activating_term)
        self.raft.request_step_down()

    # ---- broker lifecycle ----

    def register_broker(self, req: pb.RegisterBrokerRequest, timeout_s: float) -> pb.RegisterBrokerResponse:
        if req.cluster_id and req.cluster_id != self.config.cluster_id:
            raise errors.InvalidRequestError(
                f"broker {req.node_id} belongs to cluster '{req.cluster_id}', this is '{self.config.cluster_id}'")
        if req.node_id < 0:
            raise errors.InvalidRequestError(f"broker id must be >= 0, got {req.node_id}")
        if not req.incarnation_id:
            raise errors.InvalidRequestError("incarnation_id is required")
        if not req.endpoints:
            raise errors.InvalidRequestError(f"broker {req.node_id} registered without endpoints")
        if req.partition_capacity < 0:
            raise errors.InvalidRequestError(
                f"broker {req.node_id}: partition_capacity must be >= 0 (0: unbounded), got {req.partition_capacity}")
        endpoints = [[e.name, e.host, e.port] for e in req.endpoints]
        supported = req.supported_metadata_level or features.SUPPORTED_MIN
        # The checks and the proposal, one registration at a time, and never between UpdateFeatures' check of the
        # registered brokers and its commit (it holds the lock too): a broker of an older release registering then
        # was let into a cluster finalized past it (audit).
        with self._registering:
            finalized = self.raft.read(lambda s: s.metadata_level)
            if supported < finalized:
                # A node rolled back below the finalized level: it would refuse metadata the cluster already holds.
                # Said here too (once a minute a broker): the broker is of an older release, which may only log it.
                now = self._clock()
                if now - self._level_refusals.get(req.node_id, -LEVEL_REFUSAL_LOG_S) >= LEVEL_REFUSAL_LOG_S:
                    if len(self._level_refusals) >= 1024:
                        self._level_refusals.clear()
                    self._level_refusals[req.node_id] = now
                    log.warning("broker %d refused: its release supports %s up to %d, the cluster is at %d (run a "
                                "release that supports it there; a new cluster takes initial.metadata.version)",
                                req.node_id, features.METADATA_VERSION, supported, finalized)
                raise errors.UnsupportedVersionError(
                    f"broker {req.node_id}'s release supports {features.METADATA_VERSION} up to {supported}; the "
                    f"cluster is at {finalized} (a finalized level is never lowered): run a release that supports it")
            self._refuse_duplicate(req)
            result = self._propose(c.RegisterBroker(req.node_id, req.incarnation_id, endpoints, req.rack,
                                                    int(req.partition_capacity), bool(req.storage_created)),
                                   timeout_s)
            result.raise_for_error()
            with self._lock:
                self._leases[req.node_id] = self._clock()
                self._broker_levels[req.node_id] = supported
        log.info("broker %d registered (epoch %d, incarnation %s, partition capacity %s%s)", req.node_id,
                 result.value, req.incarnation_id, req.partition_capacity or "unbounded",
                 "; its log directories are new: it left every ISR" if req.storage_created else "")
        return pb.RegisterBrokerResponse(broker_epoch=result.value)

    def _refuse_duplicate(self, req: pb.RegisterBrokerRequest) -> None:
        """DUPLICATE_BROKER_REGISTRATION while another process holds broker ``req.node_id``'s session.

        As in Kafka, a new incarnation may not replace one that is unfenced and heartbeating: two
        processes started with one node.id would otherwise take the registration from each other in
        turn, each time leaving every ISR. A broker restarted on its own log directories names the
        incarnation it replaces (``previous_incarnation_id``, which only the process holding those
        directories' locks can have written), so a restart does not wait for the old session to run out.
        """
        old = self.raft.read(lambda s: s.brokers.get(req.node_id))
        if old is None or old.incarnation_id == req.incarnation_id or old.fenced:
            return
        if req.previous_incarnation_id and req.previous_incarnation_id == old.incarnation_id:
            return
        with self._lock:
            last = self._leases.get(req.node_id)
            idle_s = None if last is None else self._clock() - last
        timeout_s = self.config.broker_session_timeout_ms / 1000.0
        if idle_s is None or idle_s > timeout_s:
            return
        raise errors.DuplicateBrokerRegistrationError(
            f"broker {req.node_id} is registered by another process (incarnation {old.incarnation_id}, "
            f"last heartbeat {idle_s:.1f}s ago): a new one may register once that session ends "
            f"(broker.session.timeout.ms={self.config.broker_session_timeout_ms}) or it shuts down; "
            f"is node.id {req.node_id} configured on two nodes?")

    def heartbeat(self, req: pb.BrokerHeartbeatRequest, timeout_s: float) -> pb.BrokerHeartbeatResponse:
        broker = self.raft.read(lambda s: s.broker_with_epoch(req.node_id, req.broker_epoch))
        with self._lock:
            self._leases[req.node_id] = self._clock()
            self._broker_levels[req.node_id] = req.supported_metadata_level or features.SUPPORTED_MIN
        response = pb.BrokerHeartbeatResponse(heartbeat_interval_ms=self.config.broker_heartbeat_interval_ms)
        if req.want_shutdown:
            if not broker.fenced:
                self._finish_or_begin_shutdown(broker, timeout_s)
            broker = self.raft.read(lambda s: s.brokers[req.node_id])
            remaining = self.raft.read(lambda s: s.leadership_count(req.node_id))
            response.should_shutdown = broker.fenced or remaining == 0
        elif req.want_fence and not broker.fenced:
            self._propose(c.FenceBroker(req.node_id, req.broker_epoch), timeout_s).raise_for_error()
        elif broker.fenced and not req.want_fence and req.current_metadata_version >= broker.broker_epoch:
            # Caught up with metadata at least to its own registration: safe to serve.
            self._propose(c.UnfenceBroker(req.node_id, req.broker_epoch), timeout_s).raise_for_error()
            log.info("broker %d unfenced (metadata version %d)", req.node_id, req.current_metadata_version)
        response.is_fenced = self.raft.read(lambda s: s.brokers[req.node_id].fenced)
        return response

    def _finish_or_begin_shutdown(self, broker: BrokerState, timeout_s: float) -> None:
        if not broker.in_controlled_shutdown:
            self._propose(c.BeginControlledShutdown(broker.node_id, broker.broker_epoch),
                              timeout_s).raise_for_error()
        remaining = self.raft.read(lambda s: s.leadership_count(broker.node_id))
        if remaining == 0:
            # Leaderships moved: fence now instead of waiting for the lease to run out.
            self._propose(c.FenceBroker(broker.node_id, broker.broker_epoch), timeout_s).raise_for_error()
            log.info("broker %d finished controlled shutdown", broker.node_id)

    def controlled_shutdown(self, req: pb.ControlledShutdownRequest,
                            timeout_s: float) -> pb.ControlledShutdownResponse:
        broker = self.raft.read(lambda s: s.broker_with_epoch(req.node_id, req.broker_epoch))
        with self._lock:
            self._leases[req.node_id] = self._clock()
        if not broker.fenced and not broker.in_controlled_shutdown:
            self._propose(c.BeginControlledShutdown(req.node_id, req.broker_epoch), timeout_s).raise_for_error()
        remaining = self.raft.read(lambda s: s.leadership_count(req.node_id))
        if remaining == 0 and not broker.fenced:
            # Nothing left to lead: the broker stops now, so it is fenced now, as the heartbeat path does. It was
            # left to its session (6 s): listed unfenced meanwhile, its `brook cluster unregister` refused as
            # running, and a session-loss WARNING at every clean stop (audit of rolling restarts).
            self._propose(c.FenceBroker(req.node_id, req.broker_epoch), timeout_s).raise_for_error()
            log.info("broker %d finished controlled shutdown", req.node_id)
        return pb.ControlledShutdownResponse(remaining_leaderships=remaining)

    def _forgive_own_stall(self, now: float, gap_s: float) -> None:
        """Do not count against brokers the time this controller itself did not run.

        While the process is stopped (SIGSTOP, a paused VM, a whole host frozen) or its tick thread is
        held, heartbeats are neither received nor counted, and a leader that kept its leadership
        through the stall (a single voter, or every voter paused at once) would otherwise find every
        session run out on its first tick after it and fence the whole cluster. A gap between ticks
        longer than a heartbeat interval moves every lease on by the excess, so each broker gets at least
        ``broker.session.timeout.ms`` less one heartbeat interval of running controller to be heard.
        Only the excess is forgiven: a tick thread that is merely slow (gaps just above the interval)
        still ages leases, so a dead broker is still fenced."""
        excess = gap_s - self.config.broker_heartbeat_interval_ms / 1000.0
        if excess <= 0:
            return
        with self._lock:
            for node_id, lease in self._leases.items():
                self._leases[node_id] = min(now, lease + excess)
        log.warning("controller %d did not run for %.1fs (a paused process or a held tick thread): the brokers' "
                    "sessions are extended by %.1fs, as their heartbeats could not be counted meanwhile",
                    self.config.node_id, gap_s, excess)

    def _expire_sessions(self) -> None:
        now = self._clock()
        timeout_s = self.config.broker_session_timeout_ms / 1000.0
        live = self.raft.read(lambda s: [(b.node_id, b.broker_epoch) for b in s.brokers.values() if not b.fenced])
        with self._lock:
            for node_id, pending in list(self._fencing.items()):
                try:
                    pending.wait(0)
                except errors.RequestTimedOutError:
                    continue  # still in flight
                except errors.BrookError as exc:
                    log.warning("fencing broker %d failed: %s", node_id, exc)
                del self._fencing[node_id]
            expired = [node_id for node_id, _ in live
                       if now - self._leases.setdefault(node_id, now) > timeout_s and node_id not in self._fencing]
            if expired and self._cut_off_from_brokers(now, [node_id for node_id, _ in live], timeout_s):
                return
            for node_id, epoch in live:
                last = self._leases[node_id]
                if now - last > timeout_s and node_id not in self._fencing:
                    log.warning("broker %d missed its session (%.1fs without heartbeat): fencing", node_id,
                                now - last)
                    self._fencing[node_id] = self._submit(c.FenceBroker(node_id, epoch))

    def note_broker_contact(self) -> None:
        """A broker's heartbeat, or its search for the active controller, reached this voter (by that broker's own
        identity), whether this voter is active or not."""
        self._broker_heard_at = self._clock()

    def hears_brokers(self) -> bool:
        """Has a broker reached this voter within broker.session.timeout.ms? Asked by an active
        controller that hears none (``_cut_off_from_brokers``), through DescribeQuorum."""
        heard = self._broker_heard_at
        return heard is not None and self._clock() - heard <= self.config.broker_session_timeout_ms / 1000.0

    def _cut_off_from_brokers(self, now: float, live: list[int], timeout_s: float) -> bool:
        """Called with the lock held when a live broker's session has run out. True: do not fence now.

        An active controller cut off from every broker by the network, while it still leads the quorum, would
        fence them all: every partition offline in the metadata, and no ISR change, leader election or topic
        creation until the network heals, though the brokers and the other voters reach each other (brokers that
        cannot reach the active controller ask the other voters which one is active, naming themselves).
        So when no live broker has been heard for half a session, this controller first asks the other voters, in
        the background, whether brokers reach them. If one says so, it hands Raft leadership to that
        voter (Raft's TimeoutNow) instead of fencing: the next active controller starts every lease afresh and the
        brokers heartbeat to it. It waits half a session for the hand-over, then fences as before. If no voter
        hears brokers (they are down, or cut off from every voter), it fences them as before."""
        quiet_s = timeout_s / 2
        if not live or self._voters_hearing_brokers is None:
            return False
        if any(now - self._leases[node_id] <= quiet_s for node_id in live):
            return False  # some broker reaches this controller: the silent ones are what is wrong
        if self._cut_off_asking is not None and self._cut_off_asking.is_alive():
            return True
        answer = self._cut_off_answer
        if answer is not None and now - answer[0] < timeout_s:
            if answer[1] is None or now - answer[0] >= quiet_s:
                return False  # nobody to hand over to, or the hand-over did not happen: fence
            if now - self._cut_off_step_down_at >= STEP_DOWN_RETRY_S:
                # pysyncobj refuses a hand-over to a voter one entry behind: asked again, as _retry_step_down does
                self._cut_off_step_down_at = now
                self.raft.request_step_down(answer[1])
            return True
        silent = ", ".join(f"{node_id} ({now - self._leases[node_id]:.1f}s)" for node_id in sorted(live))
        log.warning("controller %d has heard no broker for half a session (brokers %s): asking the other voters "
                    "whether brokers reach them, before fencing", self.config.node_id, silent)
        asked_for = self._voters_hearing_brokers
        term = self._active_term

        def ask() -> None:
            try:
                hearing = asked_for()
            except Exception:  # noqa: BLE001 - the fencing goes ahead as if none heard brokers
                log.exception("controller %d could not ask the other voters whether brokers reach them",
                              self.config.node_id)
                hearing = []
            target = hearing[0] if hearing and self._active_term == term else None
            if target is None:
                log.warning("controller %d: no other voter hears brokers either: fencing the brokers it missed",
                            self.config.node_id)
            else:
                log.warning("controller %d hears no broker, and brokers reach voter %s: handing Raft leadership "
                            "over to it rather than fencing every broker", self.config.node_id, target)
            with self._lock:
                self.cut_off_outcomes["fenced" if target is None else "handed_over"] += 1
                self._cut_off_answer = (self._clock(), target)
                self._cut_off_step_down_at = float("-inf")  # the tick asks for the hand-over

        self._cut_off_asking = threading.Thread(target=ask, name="cut-off-from-brokers", daemon=True)
        self._cut_off_asking.start()
        return True

    def _maybe_rebalance(self) -> None:
        if not self.config.auto_leader_rebalance_enable:
            return
        now = self._clock()
        if now < self._next_rebalance_at:
            return
        self._next_rebalance_at = now + self.config.leader_imbalance_check_interval_s
        self.submit_preferred_elections()

    def submit_preferred_elections(self) -> int:
        """Propose moving leadership back to preferred replicas that are in sync and live; returns how many."""

        def plan(s: MetadataState) -> list[c.PartitionChangeItem]:
            eligible = {b.node_id for b in s.brokers.values() if b.eligible}
            items = []
            for topic in s.topics.values():
                for index, p in enumerate(topic.partitions):
                    if can_move_to_preferred(p.replicas, p.isr, p.leader, eligible):
                        items.append(c.PartitionChangeItem(topic.name, index, p.partition_epoch,
                                                           new_leader=p.replicas[0]))
                        if len(items) >= MAX_REBALANCE_MOVES_PER_ROUND:
                            return items
            return items

        items = self.raft.read(plan)
        if items:
            log.info("preferred leader election for %d partitions", len(items))
            self._rebalancing = self._submit(c.ChangePartition(items))
        return len(items)

    # ---- partition reassignment ----
    def alter_reassignments(self, req: pb.AlterPartitionReassignmentsRequest,
                            timeout_s: float) -> pb.AlterPartitionReassignmentsResponse:
        """Start, redirect or cancel moves. Each is one compare-and-set on the partition; the new replicas
        catch up as followers, and the controller completes the move once all of them are in sync."""
        if len(req.partitions) > MAX_PARTITION_CHANGES_PER_REQUEST:
            raise errors.PolicyViolationError(
                f"{len(req.partitions)} partitions in one request, the limit is {MAX_PARTITION_CHANGES_PER_REQUEST}")
        response = pb.AlterPartitionReassignmentsResponse()
        pending = []
        seen: set[tuple[str, int]] = set()
        room: _ReplicaRoom | None = None
        for item in req.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            try:
                if (item.topic, item.partition) in seen:
                    raise errors.InvalidRequestError(f"{item.topic}-{item.partition} appears more than once")
                seen.add((item.topic, item.partition))
                epoch, current, rf, unregistered = self.raft.read(lambda s, i=item: (
                    (p := _partition(s, i.topic, i.partition)).partition_epoch, list(p.replicas), len(p.target),
                    [r for r in i.replicas if r not in s.brokers]))
                added: dict[int, int] = {}
                if not item.cancel and req.keep_replication_factor and item.replicas and not unregistered and \
                        len(set(item.replicas)) == len(item.replicas) and len(item.replicas) != rf:
                    # KIP-860 as Kafka's controller applies it (validatePartitionReplicationFactorUnchanged): its
                    # words, and the count it keeps is the target's of a move in progress (the replicas and the
                    # joining ones less the leaving ones). A list no move can take (empty, a broker twice, an
                    # unregistered broker) is refused as such when applied, as Kafka checks the list first. The
                    # partition epoch in the command makes the check hold when the command is applied.
                    raise errors.InvalidReplicationFactorError(
                        f"The replication factor is changed from {rf} to {len(item.replicas)}")
                if not item.cancel:
                    self._check_target(item)
                    if room is None:
                        room = _ReplicaRoom(self.raft.read(_replica_room))
                    # Only the brokers it does not name yet take a replica more (until the move completes,
                    # the leaving ones keep theirs).
                    added = room.check([[r for r in item.replicas if r not in current]],
                                       f"{item.topic}-{item.partition}")
                target = None if item.cancel else list(item.replicas)
                pending.append((result, self._submit(c.AlterReassignment(item.topic, item.partition, epoch, target))))
                if room is not None:
                    room.add(added)
                log.info("reassignment of %s-%d: %s", item.topic, item.partition,
                         "cancel" if target is None else f"to replicas {target}")
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message
        self._collect(pending, timeout_s)
        return response

    def _check_target(self, item: pb.ReassignablePartition) -> None:
        """What can be told before proposing: live brokers for every new replica."""
        def check(s: MetadataState) -> None:
            current = _partition(s, item.topic, item.partition).replicas
            fenced = [r for r in item.replicas if r in s.brokers and not s.brokers[r].eligible and r not in current]
            if fenced:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"{item.topic}-{item.partition}: new replicas {fenced} are fenced or shutting down")
        self.raft.read(check)

    def list_reassignments(self, req: pb.ListPartitionReassignmentsRequest) -> pb.ListPartitionReassignmentsResponse:
        # Bounded as ElectLeaders: 500,000 partitions named (a 1.4 MB request) cost 60 MB to index (audit).
        _check_partitions_named([(tp.topic, tp.partitions) for tp in req.topic_partitions],
                                "ListPartitionReassignments")
        wanted = {(tp.topic, p) for tp in req.topic_partitions for p in tp.partitions}
        topics = {tp.topic for tp in req.topic_partitions if not tp.partitions}

        def build(s: MetadataState) -> pb.ListPartitionReassignmentsResponse:
            out = pb.ListPartitionReassignmentsResponse()
            for name, index, p in s.reassignments():
                if req.topic_partitions and (name, index) not in wanted and name not in topics:
                    continue
                out.reassignments.add(topic=name, partition=index, replicas=p.replicas, adding_replicas=p.adding,
                                      removing_replicas=p.removing, isr=p.isr, leader=p.leader)
            return out

        return self.raft.read(build)

    def _complete_reassignments(self) -> None:
        """Propose CompleteReassignment for each move whose target replicas are all in sync (bounded)."""
        for key, proposal in list(self._completing.items()):
            try:
                outcome = proposal.wait(0)
            except errors.RequestTimedOutError:
                continue  # still in flight
            except errors.BrookError as exc:
                log.info("completing the reassignment of %s-%d failed: %s", key[0], key[1], exc)
            else:
                if outcome.ok:
                    log.info("reassignment of %s-%d completed", key[0], key[1])
                else:
                    log.info("reassignment of %s-%d not completed: %s", key[0], key[1], outcome.error_message)
            del self._completing[key]
        if len(self._completing) >= MAX_REASSIGNMENT_COMPLETIONS_IN_FLIGHT:
            return

        def ready(s: MetadataState) -> list[c.CompleteReassignment]:
            out = []
            eligible: set[int] | None = None
            for name, index, p in s.reassignments():
                if (name, index) in self._completing or not all(r in p.isr for r in p.target):
                    continue
                if p.leader not in p.target:
                    # The move hands leadership to a live target replica: with none (the partition offline, a
                    # shrink onto a stopped broker) the state would refuse it, and proposing it at every tick
                    # wrote ten refused entries a second to the log for as long as they stayed down (audit).
                    if eligible is None:
                        eligible = {b.node_id for b in s.brokers.values() if b.eligible}
                    if elect_leader(p.target, p.isr, eligible, unclean_allowed=False).leader == NO_LEADER:
                        continue
                out.append(c.CompleteReassignment(name, index, p.partition_epoch))
            return out

        for cmd in self.raft.read(ready)[:MAX_REASSIGNMENT_COMPLETIONS_IN_FLIGHT - len(self._completing)]:
            self._completing[(cmd.topic, cmd.partition)] = self._submit(cmd)

    def unregister_broker(self, req: pb.UnregisterBrokerRequest, timeout_s: float) -> pb.UnregisterBrokerResponse:
        """Release a broker id for good: only a stopped (fenced) broker that no partition names any more."""
        def check(s: MetadataState) -> None:
            broker = s.brokers.get(req.broker_id)
            if broker is None:
                raise errors.error_class(ErrorCode.BROKER_ID_NOT_REGISTERED)(f"broker {req.broker_id} is not registered")
            if not broker.fenced:
                raise errors.InvalidRequestError(
                    f"broker {req.broker_id} is running (unfenced): stop it before unregistering it")
            count = s.replica_count(req.broker_id)
            if count:
                hosted = []  # five to name (the count is kept as records are applied)
                for t in s.topics.values():
                    hosted.extend(f"{t.name}-{i}" for i, p in enumerate(t.partitions) if req.broker_id in p.replicas)
                    if len(hosted) >= 5:
                        break
                raise errors.InvalidRequestError(
                    f"broker {req.broker_id} still holds {count} replicas ({', '.join(hosted[:5])}"
                    f"{' ...' if count > 5 else ''}): move them first (brook cluster decommission)")
        self.raft.read(check)
        self._propose(c.UnregisterBroker(req.broker_id), timeout_s).raise_for_error()
        with self._lock:
            self._leases.pop(req.broker_id, None)
        log.info("broker %d unregistered", req.broker_id)
        return pb.UnregisterBrokerResponse()

    # ---- leader election on demand (Kafka's ElectLeaders) ----
    def elect_leaders(self, req: pb.ElectLeadersRequest, timeout_s: float) -> pb.ElectLeadersResponse:
        """Preferred: move leadership to the first replica where it is live and in sync. Unclean: give a
        leaderless partition a live replica from outside its ISR (committed records may be lost), only
        because an operator asked for it. Each move is one compare-and-set on the partition epoch, so a
        partition that changed since it was planned is answered, never overwritten."""
        if req.election_type not in (pb.PREFERRED, pb.UNCLEAN):  # as Kafka's ElectionType.valueOf refuses it
            raise errors.InvalidRequestError(f"unknown election type {req.election_type}: 0 (preferred) or 1 (unclean)")
        unclean = req.election_type == pb.UNCLEAN
        named = [(tp.topic, list(tp.partitions)) for tp in req.topic_partitions]
        _check_partitions_named(named, "ElectLeaders")

        def plan(s: MetadataState) -> tuple[list[pb.ElectionResult], list[c.PartitionChangeItem]]:
            eligible = {b.node_id for b in s.brokers.values() if b.eligible}
            fresh = s.storage_created_ids()  # an unclean election's last choice: they started on empty disks
            results: list[pb.ElectionResult] = []
            items: list[c.PartitionChangeItem] = []
            targets: list[tuple[str, int, bool]] = []  # (topic, partition, named explicitly)
            if not named:
                targets = [(t.name, i, False) for t in s.topics.values() for i in range(len(t.partitions))]
            # Each topic and partition once: a topic named 10,000 times with no partitions (every one of them)
            # counted once against the request's bound but was expanded 10,000 times here (audit).
            merged: dict[str, set[int] | None] = {}
            for topic, partitions in named:
                if not partitions:
                    merged[topic] = None
                elif merged.get(topic, set()) is not None:
                    merged.setdefault(topic, set()).update(partitions)  # type: ignore[union-attr]
            for topic, wanted in merged.items():
                state = s.topics.get(topic)
                count = len(state.partitions) if state is not None else 0
                for index in sorted(wanted) if wanted is not None else (range(count) or [-1]):
                    targets.append((topic, index, True))
            for topic, index, explicit in targets:
                state = s.topics.get(topic)
                if state is None or not 0 <= index < len(state.partitions):
                    results.append(pb.ElectionResult(
                        topic=topic, partition=index, leader=-1, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        error_message=f"topic '{topic}' does not exist" if state is None
                        else f"topic '{topic}' has no partition {index}"))
                    continue
                p = state.partitions[index]
                code, message, item = self._plan_election(topic, index, p, eligible, unclean, fresh)
                if item is not None:
                    items.append(item)
                elif explicit:
                    results.append(pb.ElectionResult(topic=topic, partition=index, leader=p.leader,
                                                     error_code=code, error_message=message))
            return results, items

        results, items = self.raft.read(plan)
        response = pb.ElectLeadersResponse(results=results)
        if not items:
            return response
        if unclean:
            log.warning("UNCLEAN leader election requested by an operator for %d partitions: %s", len(items),
                        ", ".join(f"{i.topic}-{i.partition}->{i.new_leader}" for i in items[:20]))
        else:
            log.info("preferred leader election requested for %d partitions", len(items))
        outcome = self._propose(c.ChangePartition(items), timeout_s)
        outcome.raise_for_error()
        for item in outcome.value:
            leader = item.state.leader if item.state is not None else -1
            response.results.add(topic=item.topic, partition=item.partition, leader=leader,
                                 error_code=item.error_code, error_message=item.error_message)
        return response

    @staticmethod
    def _plan_election(topic: str, index: int, p: PartitionState, eligible: set[int],
                       unclean: bool, last_resort: set[int] | frozenset[int] = frozenset()
                       ) -> tuple[int, str, c.PartitionChangeItem | None]:
        name = f"{topic}-{index}"
        if not unclean:
            preferred = p.replicas[0] if p.replicas else -1
            if p.leader == preferred:
                return ErrorCode.ELECTION_NOT_NEEDED, f"{name}: the preferred replica {preferred} leads already", None
            if not can_move_to_preferred(p.replicas, p.isr, p.leader, eligible):
                why = "not in the ISR" if preferred not in p.isr else "fenced or shutting down"
                return (ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                        f"{name}: the preferred replica {preferred} is {why} (ISR {list(p.isr)})", None)
            return ErrorCode.NONE, "", c.PartitionChangeItem(topic, index, p.partition_epoch, new_leader=preferred)
        if p.leader != NO_LEADER:
            return ErrorCode.ELECTION_NOT_NEEDED, f"{name}: broker {p.leader} leads it", None
        chosen = elect_leader(p.replicas, p.isr, eligible, unclean_allowed=True, last_resort=last_resort)
        if chosen.leader == NO_LEADER:
            return (ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                    f"{name}: none of the replicas {list(p.replicas)} is live", None)
        return ErrorCode.NONE, "", c.PartitionChangeItem(topic, index, p.partition_epoch, new_leader=chosen.leader,
                                                         new_isr=list(chosen.isr))

    # ---- partitions ----
    def alter_partition(self, req: pb.AlterPartitionRequest, timeout_s: float) -> pb.AlterPartitionResponse:
        if len(req.items) > MAX_PARTITION_CHANGES_PER_REQUEST:
            raise errors.PolicyViolationError(
                f"{len(req.items)} partition changes in one request, the limit is {MAX_PARTITION_CHANGES_PER_REQUEST}")
        items = [self._move_instead_of_shrinking(req.broker_id, c.PartitionChangeItem(
                     i.topic, i.partition, i.partition_epoch, i.leader_epoch, list(i.new_isr)))
                 for i in req.items]
        result = self._propose(c.ChangePartition(items, req.broker_id, req.broker_epoch), timeout_s)
        result.raise_for_error()
        response = pb.AlterPartitionResponse()
        for item in result.value:
            response.results.append(self._item_result(item))
        return response

    def _move_instead_of_shrinking(self, broker_id: int, item: c.PartitionChangeItem) -> c.PartitionChangeItem:
        """A leader's ISR shrink below min.insync.replicas that drops live replicas: move leadership to the first
        of them instead, the ISR unchanged.

        The leader drops followers that have not fetched for replica.lag.time.max.ms. When that leaves fewer than
        min.insync.replicas in sync although the followers it drops are registered, unfenced and heartbeating, the
        fault is most likely between the leader and them: a leader cut from the other brokers but still reaching
        the controllers is never fenced. Taken as proposed, the shrink refuses every acks=all write until the
        network heals. They are in the ISR, so each has every committed record: electing one is clean. The new
        leader keeps the old one in the ISR (it has every record too; if the new one turns out dead, fencing it
        elects the old one again) and drops it once it does not fetch; replicas that can reach the new leader
        rejoin as they catch up. The followers often fall out one check apart ([1, 2, 3] -> [1, 3] -> [1]), so
        one live dropped replica is enough. The same partition moves this way at most once per two broker
        sessions: if the new leader cannot keep its followers either (every broker cut from every other), its
        shrink is taken as proposed.
        """
        if broker_id < 0 or item.new_isr is None:
            return item

        def read(s: MetadataState) -> tuple[str | None, list[int], list[int], set[int]] | None:
            topic = s.topics.get(item.topic)
            if topic is None or not 0 <= item.partition < len(topic.partitions):
                return None
            p = topic.partitions[item.partition]
            if (p.leader != broker_id or p.leader_epoch != item.leader_epoch
                    or p.partition_epoch != item.partition_epoch or p.adding or p.removing):
                return None  # refused as it is (or a reassignment is under way: left to it)
            live = {r for r in p.isr if (b := s.brokers.get(r)) is not None and b.eligible}
            return topic.configs.get("min.insync.replicas"), list(p.replicas), list(p.isr), live

        found = self.raft.read(read)
        if found is None:
            return item
        raw, replicas, isr, live = found
        min_isr = self._min_insync(raw) or 1
        if len(item.new_isr) >= min_isr:
            return item
        dropped = [r for r in replicas if r in live and r != broker_id and r not in item.new_isr]
        if not dropped:
            return item
        key = (item.topic, item.partition)
        now = self._clock()
        window_s = 2 * self.config.broker_session_timeout_ms / 1000.0
        with self._lock:
            last = self._moved_instead_of_shrinking.get(key)
            if last is not None and now - last < window_s:
                return item
            for k in [k for k, t in self._moved_instead_of_shrinking.items() if now - t >= window_s]:
                del self._moved_instead_of_shrinking[k]
            self._moved_instead_of_shrinking[key] = now
        log.warning("%s-%d: leader %d proposed ISR %s, below min.insync.replicas=%d, while in-sync replicas %s are "
                    "live: leadership moves to %d instead (ISR %s kept)", item.topic, item.partition, broker_id,
                    list(item.new_isr), min_isr, dropped, dropped[0], isr)
        return c.PartitionChangeItem(item.topic, item.partition, item.partition_epoch, item.leader_epoch,
                                     new_isr=isr, new_leader=dropped[0])

    def _item_result(self, item: ItemResult) -> pb.AlterPartitionResult:
        out = pb.AlterPartitionResult(topic=item.topic, partition=item.partition, error_code=item.error_code,
                                      error_message=item.error_message)
        if item.state is not None:
            topic_id = self.raft.read(lambda s: s.topics[item.topic].topic_id if item.topic in s.topics else "")
            p = item.state
            out.partition_state.CopyFrom(pb.PartitionRecord(
                topic=item.topic, topic_id=topic_id, partition=item.partition, replicas=p.replicas, isr=p.isr,
                leader=p.leader, leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch))
        return out

    # ---- topics ----
    def _loads(self, s: MetadataState) -> list[BrokerLoad]:
        """The live brokers' loads: O(brokers), from the counts the state keeps as records are applied."""
        return [BrokerLoad(b.node_id, b.rack, s.replica_count(b.node_id), s.preferred_leader_count(b.node_id),
                           b.partition_capacity)
                for b in sorted(s.brokers.values(), key=lambda b: b.node_id) if b.eligible]

    def create_topics(self, req: pb.CreateTopicsRequest, timeout_s: float,
                      quota: MutationQuota = UNLIMITED) -> pb.CreateTopicsResponse:
        check_request_size(len(req.topics))
        response = pb.CreateTopicsResponse()
        mentions = collections.Counter(t.name for t in req.topics)
        pending: list[tuple[pb.TopicResult, PendingProposal]] = []
        budget = _PartitionBudget(self.raft.read(lambda s: s.partition_count()), self.max_cluster_partitions)
        room = _ReplicaRoom(self.raft.read(_replica_room))
        reserved: list[str] = []
        try:
            self._create_each(req, response, mentions, pending, budget, room, quota, reserved)
            self._collect(pending, timeout_s)
        finally:
            self._release_names(reserved)
        for result, topic in zip(response.results, req.topics, strict=True):
            if result.error_code == ErrorCode.TOPIC_ALREADY_EXISTS:  # made by an attempt still in flight
                self._created_by_retry(result, topic.request_id)
        response.throttle_time_ms = quota.throttle_time_ms()
        return response

    def _create_each(self, req: pb.CreateTopicsRequest, response: pb.CreateTopicsResponse,
                     mentions: collections.Counter[str], pending: list[tuple[pb.TopicResult, PendingProposal]],
                     budget: _PartitionBudget, room: _ReplicaRoom, quota: MutationQuota,
                     reserved: list[str]) -> None:
        loads: list[BrokerLoad] | None = None
        for topic in req.topics:
            result = response.results.add(name=topic.name)
            try:
                if mentions[topic.name] > 1:
                    raise errors.InvalidRequestError(f"topic '{topic.name}' appears more than once in the request")
                if len(topic.request_id) > MAX_REQUEST_ID_CHARS:
                    raise errors.InvalidRequestError(
                        f"request_id of topic '{topic.name}' is longer than {MAX_REQUEST_ID_CHARS} characters")
                if self._created_by_retry(result, topic.request_id):
                    continue
                if loads is None:
                    loads = self.raft.read(self._loads)
                cmd, new_loads = self._plan_topic(topic, loads, validate_only=req.validate_only)
                self._reserve_name(topic.name, reserved if not req.validate_only else None)
                budget.take(len(cmd.assignments), f"topic '{topic.name}'")
                added = room.check(cmd.assignments, f"topic '{topic.name}'")
                if not req.validate_only:
                    quota.record(len(cmd.assignments))  # last: only what is proposed counts
                room.add(added)
                loads = new_loads
                result.num_partitions = len(cmd.assignments)
                result.replication_factor = len(cmd.assignments[0])
                result.topic_id = cmd.topic_id
                if not req.validate_only:
                    pending.append((result, self._submit(cmd)))
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message
                result.topic_id = self._existing_id(topic.name, exc.code)

    def _reserve_name(self, name: str, reserved: list[str] | None) -> None:
        """Refuse ``name`` if it collides with a topic (Kafka's controller refuses it: '.' and '_' are one
        character in its metric names), or with a name a request has proposed and not had answered; else (with
        ``reserved``) hold it until this request is answered. A check of the state alone read it before either of
        two concurrent requests had applied: 'a.b' and 'a_b' both passed."""
        key = collision_key(name)
        with self._names_lock:
            in_flight = [other for other in self._names_in_flight.get(key, ()) if other != name]
            colliding = in_flight or sorted(
                n for n in self.raft.read(lambda s: set(s.topics_by_collision_key.get(key, ()))) if n != name)
            if colliding:
                raise errors.InvalidTopicException(f"topic '{name}' collides with existing topic: {colliding[0]} "
                                                   f"('.' and '_' are the same in metric names)")
            if reserved is not None:
                self._names_in_flight.setdefault(key, collections.Counter())[name] += 1
                reserved.append(name)

    def _release_names(self, names: list[str]) -> None:
        with self._names_lock:
            for name in names:
                key = collision_key(name)
                held = self._names_in_flight[key]
                held[name] -= 1
                if held[name] <= 0:
                    del held[name]
                if not held:
                    del self._names_in_flight[key]

    def _created_by_retry(self, result: pb.TopicResult, request_id: str) -> bool:
        """True (and ``result`` filled in as a success) when the topic exists and was created with this
        ``request_id``: an earlier attempt of the same request, whose answer the client did not get."""
        if not request_id:
            return False

        def read(s: MetadataState) -> tuple[str, int, int] | None:
            t = s.topics.get(result.name)
            if t is None or t.request_id != request_id:
                return None
            return t.topic_id, len(t.partitions), len(t.partitions[0].replicas) if t.partitions else 0
        found = self.raft.read(read)
        if found is None:
            return False
        # Throttled: the same request sent again answers each of its topics so, at no cost to its sender (20 of 300
        # topics wrote 6,000 lines: audit)
        self._retried_creates.warn("CreateTopics %r: created by an earlier attempt of the same request (%s); "
                                   "answered as done", result.name, request_id)
        result.error_code, result.error_message = ErrorCode.NONE, ""
        result.topic_id, result.num_partitions, result.replication_factor = found
        return True

    def _existing_id(self, name: str, code: int) -> str:
        """The id of the topic a TOPIC_ALREADY_EXISTS is about, so an admin client retrying after an
        unknown outcome can tell its own earlier attempt (same id) from someone else's topic."""
        if code != ErrorCode.TOPIC_ALREADY_EXISTS:
            return ""
        return self.raft.read(lambda s: s.topics[name].topic_id if name in s.topics else "")

    def _collect(self, pending: list[tuple[Any, PendingProposal]], timeout_s: float) -> None:
        """Wait for submitted proposals (one shared deadline); record each outcome in its result message."""
        deadline = self._clock() + timeout_s
        for result, proposal in pending:
            try:
                outcome = proposal.wait(deadline - self._clock())
                if not outcome.ok and hasattr(result, "topic_id"):
                    result.topic_id = self._existing_id(result.name, outcome.error_code)
                result.error_code, result.error_message = outcome.error_code, outcome.error_message
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message

    def _plan_topic(self, topic: pb.CreatableTopic, loads: list[BrokerLoad], *,
                    validate_only: bool = False) -> tuple[c.CreateTopic, list[BrokerLoad]]:
        validate_topic_name(topic.name)
        if self.raft.read(lambda s: topic.name in s.topics):
            raise errors.TopicAlreadyExistsError(f"topic '{topic.name}' already exists")
        configs = log_config.validate(dict(topic.configs), strict=True)
        if topic.assignments:
            if len(topic.assignments) > MAX_PARTITIONS_PER_TOPIC:
                raise errors.InvalidPartitionsError(
                    f"{len(topic.assignments)} partitions is more than the limit of {MAX_PARTITIONS_PER_TOPIC}")
            # With explicit assignments the counts may be left unset (0), -1, or agree with them.
            if topic.num_partitions not in (-1, 0, len(topic.assignments)) or \
                    topic.replication_factor not in (-1, 0, len(topic.assignments[0].replicas)):
                raise errors.InvalidRequestError(
                    "num_partitions / replication_factor disagree with the explicit assignments")
            assignments = [list(a.replicas) for a in topic.assignments]
            self._check_manual_assignment(assignments)
            self._check_topic_configs(topic.name, configs, len(assignments[0]), validate_only=validate_only)
        else:
            # -1 means "the cluster default" (as in Kafka); 0 is invalid, not a default.
            num_partitions = topic.num_partitions if topic.num_partitions != -1 else \
                int(self.config.default("num.partitions", "1"))
            rf = topic.replication_factor if topic.replication_factor != -1 else \
                int(self.config.default("default.replication.factor", "1"))
            if num_partitions < 1:
                raise errors.InvalidPartitionsError(f"number of partitions must be at least 1, got {num_partitions}")
            if num_partitions > MAX_PARTITIONS_PER_TOPIC:
                raise errors.InvalidPartitionsError(
                    f"{num_partitions} partitions is more than the limit of {MAX_PARTITIONS_PER_TOPIC} per topic")
            if rf < 1:
                raise errors.InvalidReplicationFactorError(f"replication factor must be at least 1, got {rf}")
            if rf > len(loads):
                raise errors.InvalidReplicationFactorError(
                    f"replication factor {rf} is larger than the {len(loads)} live (unfenced) brokers")
            self._check_topic_configs(topic.name, configs, rf, validate_only=validate_only)
            assignments = place_replicas(loads, num_partitions, rf, start_index=self._rng.randrange(1 << 16))
        return (c.CreateTopic(topic.name, self._new_topic_id(), configs, assignments, topic.request_id),
                _add_load(loads, assignments))

    @property
    def max_cluster_partitions(self) -> int:
        return int(self.config.default("max.cluster.partitions", str(MAX_CLUSTER_PARTITIONS)))

    def _check_topic_configs(self, name: str, configs: Mapping[str, str], replication_factor: int, *,
                             validate_only: bool) -> None:
        """What no single config's check sees: the topic's configs (``configs``, its overrides, over the cluster
        defaults) together."""
        self._check_min_insync(name, configs, replication_factor, validate_only=validate_only)

        def lag(key: str) -> int:
            raw = self._topic_value(configs, key)
            return int(log_config.parse_value(key, raw if raw is not None else log_config.TOPIC_CONFIGS[key].default))
        low, high = lag("min.compaction.lag.ms"), lag("max.compaction.lag.ms")
        if low > high:  # Kafka's LogConfig refuses it: no record could be both old enough and not too old
            raise errors.InvalidConfigError(f"topic '{name}': conflicting compaction lags, min.compaction.lag.ms "
                                            f"{low} > max.compaction.lag.ms {high}")

    def _check_min_insync(self, name: str, configs: Mapping[str, str], replication_factor: int, *,
                          validate_only: bool) -> None:
        """min.insync.replicas (the topic's, else the cluster default) larger than the replication factor is
        allowed, as Kafka allows it: acks=0 and acks=1 writes go on, and every acks=all write is refused at once
        with NOT_ENOUGH_REPLICAS (the ISR can never be large enough). Applications create RF 1 topics of their own
        on clusters whose default is 2 (faust's repartition topics): refusing the create stopped them where Kafka
        takes their acks=1 writes. Logged, so an operator can tell; not for a request that only validates, which
        changes nothing and costs its sender nothing (20 of them, 1,000 topics each, wrote 20,000 lines: audit)."""
        value = self._min_insync(configs.get("min.insync.replicas"))
        if value is not None and value > replication_factor and not validate_only:
            source = "min.insync.replicas" if "min.insync.replicas" in configs else \
                "the cluster default min.insync.replicas"
            log.warning("topic '%s': %s=%d is larger than its replication factor %d: acks=all writes to it are "
                        "refused with NOT_ENOUGH_REPLICAS (acks=0 and 1 are taken)", name, source, value,
                        replication_factor)

    def _topic_value(self, configs: Mapping[str, str], key: str) -> str | None:
        """A topic config's value: the topic's own (``configs``), else the cluster default; None for the built-in."""
        return configs[key] if key in configs else self.topic_default(key)

    def _min_insync(self, topic_value: str | None) -> int | None:
        """A topic's min.insync.replicas: its own ``topic_value``, else the cluster default; None for the built-in 1."""
        raw = topic_value if topic_value is not None else self.topic_default("min.insync.replicas")
        return None if raw is None else int(log_config.parse_value("min.insync.replicas", raw))  # type: ignore[call-overload]

    def _check_manual_assignment(self, assignments: list[list[int]]) -> None:
        rf = len(assignments[0])
        registered = self.raft.read(lambda s: set(s.brokers))
        for index, replicas in enumerate(assignments):
            if len(replicas) != rf:  # Kafka's code for it: the assignment is wrong, not a replication factor
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"partition {index} has {len(replicas)} replicas, partition 0 has {rf}")
            if len(set(replicas)) != len(replicas) or not replicas:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"partition {index}: replicas {replicas} must be distinct and non-empty")
            unknown = [r for r in replicas if r not in registered]
            if unknown:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"partition {index} names unregistered brokers {unknown}")

    def delete_topics(self, req: pb.DeleteTopicsRequest, timeout_s: float,
                      quota: MutationQuota = UNLIMITED) -> pb.DeleteTopicsResponse:
        check_request_size(len(req.names))
        response = pb.DeleteTopicsResponse()
        pending = []
        mentions = collections.Counter(req.names)
        for name in req.names:
            result = response.results.add(name=name)
            if mentions[name] > 1:  # Kafka: "Duplicate topic name." at each mention, none deleted
                result.error_code = ErrorCode.INVALID_REQUEST
                result.error_message = f"topic '{name}' appears more than once in the request"
                continue
            found = self.raft.read(lambda s, n=name: (s.topics[n].topic_id, len(s.topics[n].partitions))
                                   if n in s.topics else None)
            if found is None:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                result.error_message = f"topic '{name}' does not exist"
                continue
            topic_id, partitions = found
            result.topic_id = topic_id
            try:
                quota.record(partitions)
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message
                continue
            pending.append((result, self._submit(c.DeleteTopic(name, topic_id))))
        self._collect(pending, timeout_s)
        response.throttle_time_ms = quota.throttle_time_ms()
        return response

    def create_partitions(self, req: pb.CreatePartitionsRequest, timeout_s: float,
                          quota: MutationQuota = UNLIMITED) -> pb.CreatePartitionsResponse:
        check_request_size(len(req.topics))
        response = pb.CreatePartitionsResponse()
        pending = []
        budget = _PartitionBudget(self.raft.read(lambda s: s.partition_count()), self.max_cluster_partitions)
        room = _ReplicaRoom(self.raft.read(_replica_room))
        mentions = collections.Counter(item.name for item in req.topics)
        # The brokers' loads (a walk over every partition of the cluster) once a request, not once an item:
        # 1,000 items of one topic, each refused, kept a controller of 150,000 partitions busy 51 s (audit).
        loads: list[BrokerLoad] | None = None
        for item in req.topics:
            result = response.results.add(name=item.name)
            try:
                if mentions[item.name] > 1:
                    raise errors.InvalidRequestError(f"topic '{item.name}' appears more than once in the request")
                if loads is None and not item.assignments:
                    loads = self.raft.read(self._loads)
                cmd = self._plan_partitions(item, loads or [])
                budget.take(len(cmd.assignments), f"topic '{item.name}'")
                added = room.check(cmd.assignments, f"topic '{item.name}'")
                if loads is not None:
                    loads = _add_load(loads, cmd.assignments)
                result.topic_id = cmd.topic_id
                result.num_partitions = item.count
                result.replication_factor = len(cmd.assignments[0])
                if not req.validate_only:
                    quota.record(len(cmd.assignments))  # last: only what is proposed counts
                    pending.append((result, self._submit(cmd)))
                room.add(added)
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message
        self._collect(pending, timeout_s)
        response.throttle_time_ms = quota.throttle_time_ms()
        return response

    def _plan_partitions(self, item: pb.CreatePartitionsTopic, loads: list[BrokerLoad]) -> c.CreatePartitions:
        def counts(s: MetadataState) -> tuple[str, int, int]:
            topic = s.topics.get(item.name)
            if topic is None:
                raise errors.UnknownTopicOrPartitionError(f"topic '{item.name}' does not exist")
            return topic.topic_id, len(topic.partitions), topic.partitions[0].replication_factor

        topic_id, current, rf = self.raft.read(counts)
        if item.count <= current:
            raise errors.InvalidPartitionsError(
                f"topic '{item.name}' has {current} partitions; the count can only be increased (asked {item.count})")
        if item.count > MAX_PARTITIONS_PER_TOPIC:
            raise errors.InvalidPartitionsError(
                f"{item.count} partitions is more than the limit of {MAX_PARTITIONS_PER_TOPIC} per topic")
        # Only now (the request is plausible) the topic's replica lists, for placement.
        existing = self.raft.read(lambda s: [list(p.replicas) for p in s.topics[item.name].partitions]
                                  if item.name in s.topics else [])
        new = item.count - current
        if item.assignments:
            assignments = [list(a.replicas) for a in item.assignments]
            if len(assignments) != new:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"{len(assignments)} assignments given for {new} new partitions")
            self._check_manual_assignment(assignments)
            if len(assignments[0]) != rf:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"new partitions have {len(assignments[0])} replicas, the topic has {rf}")
        else:
            if rf > len(loads):
                raise errors.InvalidReplicationFactorError(
                    f"replication factor {rf} is larger than the {len(loads)} live (unfenced) brokers")
            assignments = place_replicas(loads, new, rf, start_index=self._rng.randrange(1 << 16),
                                         topic_assignments=existing)
        return c.CreatePartitions(item.name, topic_id, current, assignments)

    # ---- configs ----
    def alter_configs(self, req: pb.AlterConfigsRequest, timeout_s: float) -> pb.AlterConfigsResponse:
        """Alter topics' configs (what Kafka's AlterConfigs and IncrementalAlterConfigs come to), one command
        a topic. A topic named more than once is refused at every mention and none of them applied, as
        Kafka's brokers and controllers do: proposed once per mention, one 30 KB request naming a topic
        1,000 times made 1,000 Raft commits (audit)."""
        check_request_size(len(req.resources))
        if any(resource.list_ops for resource in req.resources):
            # APPEND/SUBTRACT read the current value: one such request at a time, from its read to its commit,
            # so that two admins' changes to one list both land (Kafka's controller does it on its one thread).
            with self._list_ops_lock:
                return self._alter_configs(req, timeout_s)
        return self._alter_configs(req, timeout_s)

    def _alter_configs(self, req: pb.AlterConfigsRequest, timeout_s: float) -> pb.AlterConfigsResponse:
        mentions = collections.Counter(resource.topic for resource in req.resources)
        response = pb.AlterConfigsResponse()
        pending = []
        for resource in req.resources:
            result = response.results.add(name=resource.topic)
            try:
                if mentions[resource.topic] > 1:
                    raise errors.InvalidRequestError(
                        f"Duplicate resource: topic '{resource.topic}' appears {mentions[resource.topic]} times in "
                        f"the request; each resource must appear at most once")
                found = self.raft.read(lambda s, n=resource.topic: (
                    s.topics[n].topic_id, dict(s.topics[n].configs), _smallest_rf(s.topics[n]))
                    if n in s.topics else None)
                if found is None:
                    raise errors.UnknownTopicOrPartitionError(f"topic '{resource.topic}' does not exist")
                topic_id, current, rf = found
                to_set = log_config.validate({**dict(resource.set), **_list_results(
                    resource.list_ops, resource.set, resource.delete, lambda name: name, current)}, strict=True)
                unknown = [k for k in resource.delete if k not in log_config.TOPIC_CONFIGS]
                if unknown:
                    raise errors.InvalidConfigError(f"cannot delete unknown topic configs {unknown}")
                if both := sorted(set(resource.set) & set(resource.delete)):
                    # Which one wins is not the caller's to guess (AlterClusterConfigs refuses it too).
                    raise errors.InvalidConfigError(f"'{both[0]}' is both set and deleted")
                after = {k: v for k, v in current.items() if k not in resource.delete}
                after.update(to_set)
                self._check_topic_configs(resource.topic, after, rf, validate_only=req.validate_only)
                result.topic_id = topic_id
                if not req.validate_only:
                    cmd = c.AlterConfigs(resource.topic, topic_id, to_set, list(resource.delete))
                    pending.append((result, self._submit(cmd)))
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message
        self._collect(pending, timeout_s)
        return response

    def describe_configs(self, req: pb.DescribeConfigsRequest) -> pb.DescribeConfigsResponse:
        # Each topic once, and a bounded number of them: one topic named 350,000 times (2.8 MB) made the
        # controller build a 794 MB answer, stall its Raft thread for seconds and fence brokers (audit).
        names = list(dict.fromkeys(req.topics))
        check_request_size(len(names))
        response = pb.DescribeConfigsResponse()
        defaults = {key: (cluster_default if (cluster_default := self.topic_default(key)) is not None
                          else definition.default) for key, definition in log_config.TOPIC_CONFIGS.items()}
        overrides_of = self.raft.read(lambda s: {n: dict(s.topics[n].configs) for n in names if n in s.topics})
        for name in names:
            result = response.results.add(topic=name)
            overrides = overrides_of.get(name)
            if overrides is None:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                result.error_message = f"topic '{name}' does not exist"
                continue
            for key, definition in log_config.TOPIC_CONFIGS.items():
                if key in overrides:
                    value, is_default = overrides[key], False
                else:
                    value, is_default = defaults[key], True
                result.entries.add(name=key, value=value, is_default=is_default, documentation=definition.doc)
        return response

    def topic_default(self, name: str) -> str | None:
        """A topic config's cluster default: the dynamic cluster config, else this node's file."""
        broker_key = BROKER_DEFAULT_KEYS.get(name)
        if broker_key is not None:
            dynamic = self.raft.read(lambda s: s.cluster_configs.get(broker_key))
            if dynamic is not None:
                return dynamic
        return self.config.topic_default(name)

    # ---- dynamic cluster configs ----
    def alter_cluster_configs(self, req: pb.AlterClusterConfigsRequest,
                              timeout_s: float) -> pb.AlterClusterConfigsResponse:
        if req.list_ops:
            with self._list_ops_lock:  # see alter_configs
                return self._alter_cluster_configs(req, timeout_s)
        return self._alter_cluster_configs(req, timeout_s)

    def _alter_cluster_configs(self, req: pb.AlterClusterConfigsRequest,
                               timeout_s: float) -> pb.AlterClusterConfigsResponse:
        lists = _list_results(req.list_ops, req.set, req.delete, cluster_configs.TOPIC_KEY_OF.get,
                              self.raft.read(lambda s: dict(s.cluster_configs)))
        to_set = cluster_configs.validate({**dict(req.set), **lists}, list(req.delete))
        if req.validate_only:
            return pb.AlterClusterConfigsResponse()
        self._propose(c.AlterClusterConfigs(to_set, list(req.delete)), timeout_s).raise_for_error()
        if "min.insync.replicas" in to_set:
            # Allowed above some topics' replication factor, as in Kafka: acks=all writes to those are then
            # refused with NOT_ENOUGH_REPLICAS (see _check_min_insync); the operator is told which.
            value = int(to_set["min.insync.replicas"])
            too_small = self.raft.read(lambda s: sorted(
                f"{t.name} (RF {_smallest_rf(t)})" for t in s.topics.values()
                if "min.insync.replicas" not in t.configs and _smallest_rf(t) < value))
            if too_small:
                log.warning("cluster default min.insync.replicas=%d is larger than the replication factor of %d "
                            "topics without their own value (acks=all writes to them are refused with "
                            "NOT_ENOUGH_REPLICAS): %s%s", value, len(too_small), ", ".join(too_small[:5]),
                            " ..." if len(too_small) > 5 else "")
        log.info("cluster configs changed: set %s, deleted %s", to_set, list(req.delete))
        return pb.AlterClusterConfigsResponse()

    def describe_cluster_configs(self) -> pb.DescribeClusterConfigsResponse:
        dynamic = self.raft.read(lambda s: dict(s.cluster_configs))
        response = pb.DescribeClusterConfigsResponse()
        for key in cluster_configs.known_keys():
            if key in dynamic:
                value, source = dynamic[key], "dynamic"
            else:
                static = (self.config.defaults or {}).get(key)
                value, source = (static, "node") if static is not None else \
                    (cluster_configs.builtin_default(key), "default")
            response.entries.add(name=key, value=value, source=source, documentation=cluster_configs.doc(key))
        return response

    # ---- finalized features ----
    def _node_levels(self, max_age_s: float, *, stale_ok: bool = False) -> list[pb.NodeFeatureSupport]:
        """Each voter's and registered broker's highest supported brook.metadata.version (0: unknown, and why). A
        broker counts only while its session is live: one stopped may come back on another release."""
        out = [pb.NodeFeatureSupport(node_id=n, role="controller", supported_max=level, problem=problem)
               for n, (level, problem) in sorted(self._voter_levels(max_age_s, stale_ok=stale_ok).items())]
        brokers = self.raft.read(lambda s: sorted(s.brokers))
        session_s = self.config.broker_session_timeout_ms / 1000.0
        now = self._clock()
        with self._lock:
            known = dict(self._broker_levels)
            leases = dict(self._leases)
        for b in brokers:
            level, lease = known.get(b, 0), leases.get(b)
            if lease is None or now - lease > session_s:
                level, problem = 0, "its session is not live (stopped?): start it, or unregister it if it is gone"
            elif not level:
                problem = "it has not sent a heartbeat to this controller since it became active"
            else:
                problem = ""
            out.append(pb.NodeFeatureSupport(node_id=b, role="broker", supported_max=level, problem=problem))
        return out

    def describe_features(self) -> pb.DescribeFeaturesResponse:
        level, version = self.raft.read(lambda s: (s.metadata_level, s.version))
        response = pb.DescribeFeaturesResponse(name=features.METADATA_VERSION, finalized_level=level,
                                               supported_min=features.SUPPORTED_MIN,
                                               supported_max=features.SUPPORTED_MAX, metadata_version=version)
        response.nodes.extend(self._node_levels(DESCRIBE_FEATURES_MAX_AGE_S, stale_ok=True))
        return response

    def update_features(self, req: pb.UpdateFeaturesRequest, timeout_s: float) -> pb.UpdateFeaturesResponse:
        """Raise the finalized level once every voter and registered broker supports it (Kafka's UpdateFeatures:
        FeatureControlManager refuses a level some registered node does not support)."""
        if req.name != features.METADATA_VERSION:
            raise errors.InvalidRequestError(features.unsupported_feature(req.name))
        current = self.raft.read(lambda s: s.metadata_level)
        if not features.SUPPORTED_MIN <= req.level <= features.SUPPORTED_MAX:
            raise errors.InvalidUpdateVersionError(
                f"{req.name} {req.level} is outside the levels this controller's release supports "
                f"({features.SUPPORTED_MIN}..{features.SUPPORTED_MAX})")
        if req.level < current:
            raise errors.InvalidUpdateVersionError(
                f"{req.name} cannot be lowered from {current} to {req.level}: what the higher level let the "
                f"controller write stays in the metadata")
        if req.validate_only or req.level == current:
            if req.level > current:
                self._check_nodes_support(req.level)
            return pb.UpdateFeaturesResponse(finalized_level=current if req.validate_only else req.level)
        with self._registering:  # no broker registers between the check of the registered ones and the commit
            self._check_nodes_support(req.level)
            result = self._propose(c.UpdateFeature(req.name, req.level), timeout_s)
        result.raise_for_error()
        log.info("%s finalized at %d (was %d)", req.name, req.level, current)
        return pb.UpdateFeaturesResponse(finalized_level=req.level)

    def _check_nodes_support(self, level: int) -> None:
        behind = [f"{n.role} {n.node_id} ({n.problem or f'supports up to {n.supported_max}'})"
                  for n in self._node_levels(0.0) if n.supported_max < level]
        if behind:
            raise errors.FeatureUpdateFailedError(
                f"cannot finalize {features.METADATA_VERSION} {level}: not every node runs a release that supports "
                f"it: {'; '.join(behind)}. Upgrade them (or unregister a broker that is gone) and try again")

    # ---- producer ids ----
    def allocate_producer_ids(self, req: pb.AllocateProducerIdsRequest,
                              timeout_s: float) -> pb.AllocateProducerIdsResponse:
        result = self._propose(c.AllocateProducerIds(req.broker_id, req.broker_epoch, PRODUCER_ID_BLOCK_SIZE),
                                   timeout_s)
        result.raise_for_error()
        start, length = result.value
        return pb.AllocateProducerIdsResponse(producer_id_start=start, producer_id_len=length)

    # ---- cluster ----
    def describe_cluster(self) -> pb.DescribeClusterResponse:
        """Every broker, topic and partition. O(brokers + changes since the previous call) under the state
        lock (see cluster_view.py); the answer may be shared with other callers: do not change it."""
        min_insync = int(self.topic_default("min.insync.replicas") or "1")
        return self.cluster_view.describe(self.config.cluster_id, min_insync)

    def lease_ages_s(self) -> dict[int, float]:
        now = self._clock()
        with self._lock:
            return {b: now - t for b, t in self._leases.items()}


def _list_results(ops: Any, to_set: Any, to_delete: Any, topic_key: Callable[[str], str | None],
                  current: Mapping[str, str]) -> dict[str, str]:
    """The values APPEND/SUBTRACT ``ops`` make of LIST keys, from the resource's own ``current`` values, else the
    key's built-in default (never a cluster default a topic inherits: Kafka's controller's rule). ``topic_key``
    names the topic config a key stands for (itself for a topic; the cluster key's for the cluster defaults)."""
    out: dict[str, str] = {}
    for op in ops:
        d = log_config.TOPIC_CONFIGS.get(topic_key(op.name) or "")
        if d is None or d.kind != "list":
            raise errors.InvalidConfigError(
                f"Can't {'SUBTRACT' if op.subtract else 'APPEND'} to key {op.name} because its type is not LIST.")
        if op.name in out or op.name in to_set or op.name in to_delete:
            raise errors.InvalidRequestError(f"'{op.name}' appears more than once in the resource's operations")
        out[op.name] = log_config.list_value(current.get(op.name), d.default, op.subtract, op.value)
    return out


def _partition(s: MetadataState, topic: str, index: int) -> PartitionState:
    state = s.topics.get(topic)
    if state is None or not 0 <= index < len(state.partitions):
        raise errors.UnknownTopicOrPartitionError(f"{topic}-{index} does not exist")
    return state.partitions[index]


def _smallest_rf(topic: Any) -> int:
    """The smallest replica count among a topic's partitions (they may differ from brook.metadata.version 5)."""
    return min(p.replication_factor for p in topic.partitions)


def _check_partitions_named(named: list[tuple[str, Any]], what: str) -> None:
    """A request naming (topic, its partitions: none for all) may name at most MAX_PARTITION_CHANGES_PER_REQUEST."""
    if sum(max(1, len(p)) for _, p in named) > MAX_PARTITION_CHANGES_PER_REQUEST:
        raise errors.PolicyViolationError(f"more than {MAX_PARTITION_CHANGES_PER_REQUEST} partitions in one {what} request")


def check_request_size(count: int) -> None:
    if count > MAX_TOPICS_PER_REQUEST:
        raise errors.PolicyViolationError(
            f"{count} topics in one request, the limit is {MAX_TOPICS_PER_REQUEST}: split the request")


class _PartitionBudget:
    """New partitions one request may still add: per request and cluster-wide."""

    def __init__(self, existing: int, cluster_limit: int) -> None:
        self._existing = existing
        self._cluster_limit = cluster_limit
        self._taken = 0

    def take(self, count: int, what: str) -> None:
        if self._taken + count > MAX_PARTITIONS_PER_REQUEST:
            raise errors.PolicyViolationError(
                f"{what}: the request would add {self._taken + count} partitions, the limit per request is "
                f"{MAX_PARTITIONS_PER_REQUEST}")
        if self._existing + self._taken + count > self._cluster_limit:
            raise errors.PolicyViolationError(
                f"{what}: the cluster would have {self._existing + self._taken + count} partitions, the limit is "
                f"{self._cluster_limit} (max.cluster.partitions)")
        self._taken += count


def _add_load(loads: list[BrokerLoad], assignments: list[list[int]]) -> list[BrokerLoad]:
    """The loads after ``assignments`` are placed (so one request's topics spread too)."""
    extra_replicas: dict[int, int] = {}
    extra_leaders: dict[int, int] = {}
    for replicas in assignments:
        for r in replicas:
            extra_replicas[r] = extra_replicas.get(r, 0) + 1
        extra_leaders[replicas[0]] = extra_leaders.get(replicas[0], 0) + 1
    return [BrokerLoad(b.node_id, b.rack, b.replicas + extra_replicas.get(b.node_id, 0),
                       b.leaders + extra_leaders.get(b.node_id, 0), b.capacity) for b in loads]


def _replica_room(s: MetadataState) -> dict[int, tuple[int, int]]:
    """Broker id -> (replicas it holds, its capacity; 0 = unbounded), every registered broker: O(brokers)."""
    return {b.node_id: (s.replica_count(b.node_id), b.partition_capacity) for b in s.brokers.values()}


class _ReplicaRoom:
    """The room each broker has left for partition replicas, over one request (placed or named explicitly,
    fenced brokers included): a change that would put more replicas on a broker than the capacity it registered
    with is refused with POLICY_VIOLATION naming the broker, its capacity and its count, before anything is
    proposed. The state checks the same when it applies (two requests planned at once)."""

    def __init__(self, counts: dict[int, tuple[int, int]]) -> None:
        self._counts = dict(counts)

    def check(self, assignments: list[list[int]], what: str) -> dict[int, int]:
        """The replicas ``assignments`` add per broker; raises if one has no room for them."""
        added: dict[int, int] = {}
        for replicas in assignments:
            for r in replicas:
                added[r] = added.get(r, 0) + 1
        for broker_id in sorted(added):
            count, capacity = self._counts.get(broker_id, (0, 0))
            if 0 < capacity < count + added[broker_id]:
                raise errors.PolicyViolationError(
                    replica_room_refusal(what, broker_id, capacity, count, added[broker_id]))
        return added

    def add(self, added: dict[int, int]) -> None:
        for broker_id, n in added.items():
            count, capacity = self._counts.get(broker_id, (0, 0))
            self._counts[broker_id] = (count + n, capacity)
