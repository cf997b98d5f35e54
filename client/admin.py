"""Admin: topics, partitions, configs, cluster and quorum, offsets, consumer groups.

    with Admin(bootstrap_servers="127.0.0.1:9092") as admin:
        admin.create_topics([NewTopic("events", num_partitions=6, replication_factor=3)])
        admin.describe_topics(["events"])
        admin.alter_configs("events", set={"retention.ms": "86400000"})

Topic and config changes go to the active controller (through
``metadata_quorum.client.ControllerClient``; its endpoints come from the brokers'
Metadata answer). As Kafka's admin client does, a topic whose result says the
controller changed under it (NOT_CONTROLLER, "not committed, leadership changed") or
REQUEST_TIMED_OUT is sent again, to the new active controller, until
``request_timeout_ms``. A retried request may meet the effect of its own first attempt
(which did commit after all): CreateTopics then sees TOPIC_ALREADY_EXISTS with the very
topic id the first attempt proposed and reports success; DeleteTopics reports success
when the topic it may already have deleted is gone; CreatePartitions when the topic
already has the asked count. Any other TOPIC_ALREADY_EXISTS is reported as is. A topic refused by
the caller's controller mutation quota (KIP-599) is not retried: its THROTTLING_QUOTA_EXCEEDED says
"throttled: controller mutation quota of R/s exceeded, retry after N ms". Group operations to each group's coordinator
(``proto/group.proto``). Every failure is the typed ``BrookError`` for the server's
error code, carrying the server's message. Group calls retry, with backoff within
``request_timeout_ms``, while a group's coordinator moves, loads or is not available
yet (also when only the per-group result says so), finding it again each time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from client import errors
from client.cluster import ClusterClient, as_timeout_ms, rpc_error
from client.coordinator import GroupCoordinatorClient, group_stub
from client.security import CONFIG_KEYS, SecurityConfig
from client.types import BrokerMetadata, OffsetAndMetadata, TopicMetadata, TopicPartition
from metadata_quorum.client import SecurityControllerClient
from metadata_quorum.security import AclBinding
from proto import broker_pb2, controller_pb2, group_pb2, security_pb2

T = TypeVar("T")

log = logging.getLogger(__name__)

# How long wait_for_brokers gives one broker to answer before taking it for down (a broker applying
# metadata answers Metadata in milliseconds; one stopped by SIGSTOP never does).
BROKER_ANSWER_S = 2.0
# How often wait_for_brokers looks again at which brokers are fenced, while some are behind.
FENCED_LOOK_S = 0.5

OFFSET_SPECS = {"earliest": -2, "latest": -1, "max_timestamp": -3}
# Per-group answers that mean "ask the group's coordinator again": it moved (NOT_COORDINATOR),
# is replaying its offsets partition (LOAD_IN_PROGRESS) or has none yet (NOT_AVAILABLE).
_COORDINATOR_RETRY_CODES = frozenset({errors.ErrorCode.NOT_COORDINATOR, errors.ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                      errors.ErrorCode.COORDINATOR_NOT_AVAILABLE})
COORDINATOR_CACHE_MAX = 256  # bound on the groups whose coordinator an Admin remembers
# Per-topic answers of a controller write that mean "send it again to the active controller".
_CONTROLLER_RETRY_CODES = frozenset({errors.ErrorCode.NOT_CONTROLLER, errors.ErrorCode.REQUEST_TIMED_OUT})
_RETRY_BACKOFF_S = (0.05, 1.0)
_MIN_ATTEMPT_S = 0.2  # no retry is started with less time than this left


@dataclass
class NewTopic:
    name: str
    num_partitions: int = -1  # -1 = the cluster's num.partitions
    replication_factor: int = -1  # -1 = default.replication.factor
    configs: dict[str, str] = field(default_factory=dict)
    replica_assignments: list[list[int]] | None = None  # explicit replicas per partition


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str
    is_default: bool
    documentation: str = ""
    source: str = ""  # cluster configs: dynamic, node or default


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    metadata_version: int
    brokers: list[BrokerMetadata]
    topics: int
    partitions: int
    fenced_brokers: list[int]


@dataclass(frozen=True)
class QuorumVoter:
    node_id: int
    raft_address: str
    log_end_index: int
    lag: int
    last_contact_ms_ago: int
    is_leader: bool


@dataclass(frozen=True)
class QuorumDescription:
    leader_id: int
    term: int
    commit_index: int
    metadata_version: int
    voters: list[QuorumVoter]
    responder_id: int = -1  # the voter whose view this is
    responder_is_active: bool = True  # False: no active controller answered; a follower's own view


@dataclass(frozen=True)
class NodeFeatureSupport:
    node_id: int
    role: str  # "controller" or "broker"
    supported_max: int  # highest brook.metadata.version its release supports; 0: unknown (see problem)
    problem: str


@dataclass(frozen=True)
class FeatureDescription:
    """The finalized brook.metadata.version and what each node supports (metadata_quorum/features.py)."""

    name: str
    finalized_level: int
    supported_min: int  # of the active controller's release
    supported_max: int
    metadata_version: int
    nodes: list[NodeFeatureSupport]


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    coordinator_id: int
    group_type: str = "classic"  # or "consumer": Kafka's consumer protocol (KIP-848)


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    client_host: str
    subscribed_topics: list[str]
    assignment: list[TopicPartition]
    group_instance_id: str = ""  # a static member's (group.instance.id); "" for a dynamic one
    # A member of Kafka's consumer protocol subscribed to a pattern: the pattern (subscribed_topics: its matches)
    subscribed_topic_regex: str = ""


@dataclass(frozen=True)
class GroupOffset:
    committed_offset: int
    log_end_offset: int
    lag: int
    member_id: str
    metadata: str


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    generation_id: int
    leader: str
    coordinator_id: int
    members: list[MemberDescription]
    offsets: dict[TopicPartition, GroupOffset]
    group_type: str = "classic"  # or "consumer" (KIP-848: protocol_name is its assignor, generation its epoch)


@dataclass(frozen=True)
class ReplicaInfo:
    """One partition's log on one broker (DescribeLogDirs)."""

    topic: str
    partition: int
    size_bytes: int
    offset_lag: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    is_leader: bool
    segments: int


@dataclass(frozen=True)
class ProducerState:
    """An idempotent producer a partition's leader tracks (Kafka's ProducerState of describeProducers)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int  # -1: none yet
    last_timestamp: int  # ms, the last batch's max timestamp; -1 unknown
    coordinator_epoch: int = -1  # of the last transaction marker it had; -1 none
    current_txn_start_offset: int = -1  # first offset of its ongoing transaction; -1 none


@dataclass(frozen=True)
class LogDirInfo:
    path: str
    error: errors.BrookError | None
    total_bytes: int  # of the file system holding it; -1 unknown
    usable_bytes: int
    replicas: list[ReplicaInfo]


@dataclass(frozen=True)
class PartitionReassignment:
    """A move in progress: ``replicas`` is the target followed by the replicas leaving."""

    replicas: list[int]
    adding_replicas: list[int]
    removing_replicas: list[int]
    isr: list[int]
    leader: int


class Admin:
    def __init__(self, bootstrap_servers: str | list[str] = "127.0.0.1:9092", *, request_timeout_ms: int = 30000,
                 controller_endpoints: list[tuple[str, int]] | None = None,
                 security: SecurityConfig | None = None, **security_configs: Any) -> None:
        """``security`` or Kafka's client security configs as keywords (``security_protocol="SASL_SSL"``,
        ``ssl_ca_location=...``, ``sasl_username=...``), as Producer and Consumer take them."""
        unknown = sorted(k for k in security_configs if CONFIG_KEYS.get(k.replace("_", ".")) is None)
        if unknown:
            raise errors.InvalidConfigError(f"unknown admin config {unknown[0]!r}")
        self.request_timeout_ms = request_timeout_ms
        self.security = (security or SecurityConfig()).merged(security_configs) if security_configs \
            else security or SecurityConfig()
        self.cluster = ClusterClient(bootstrap_servers, request_timeout_ms=request_timeout_ms, security=self.security)
        self._controller_endpoints = controller_endpoints
        self._controller: Any = None
        self._coordinators: dict[str, GroupCoordinatorClient] = {}

    # ---- plumbing ----
    @property
    def controller(self) -> Any:
        """The ControllerClient (created on first use from the brokers' controller endpoints)."""
        if self._controller is None:
            endpoints = self._controller_endpoints or self.cluster.metadata().controllers
            if not endpoints:
                raise errors.BrokerNotAvailableError("the brokers advertise no controller endpoints")
            self._controller = SecurityControllerClient(list(endpoints), timeout_s=self.request_timeout_ms / 1000,
                                                         security=self.security)
        return self._controller

    def _call(self, method: str, request: Any, timeout_ms: int | None = None) -> Any:
        timeout_s = (timeout_ms or self.request_timeout_ms) / 1000
        return self.controller.call(method, request, timeout_s=timeout_s)

    def _call_topics(self, method: str, names: list[str], build: Callable[[list[str], int], Any],
                     timeout_ms: int | None) -> tuple[dict[str, Any], dict[str, str]]:
        """Send a per-topic controller write, retrying the topics whose result is NOT_CONTROLLER or
        REQUEST_TIMED_OUT until the request timeout. Returns ({name: final result},
        {name: topic id of an earlier attempt whose outcome is unknown}): the caller decides
        whether a later "already exists"/"does not exist" is that attempt's own effect."""
        budget_ms = timeout_ms or self.request_timeout_ms
        deadline = time.monotonic() + budget_ms / 1000
        final: dict[str, Any] = {}
        unknown: dict[str, str] = {}
        pending = list(names)
        attempt = 0
        while pending:
            remaining_ms = as_timeout_ms(deadline - time.monotonic())
            try:
                response = self._call(method, build(pending, remaining_ms), remaining_ms)
            except errors.BrookError as exc:
                if attempt == 0:
                    raise
                # A retry found no controller in time: the topics settled earlier keep their answers.
                for name in pending:
                    final[name] = controller_pb2.TopicResult(name=name, error_code=exc.code,
                                                             error_message=exc.message)
                break
            retry = []
            for r in response.results:
                # Another attempt only with time left for it; else this answer is the final one.
                if r.error_code in _CONTROLLER_RETRY_CODES and deadline - time.monotonic() > _MIN_ATTEMPT_S:
                    # A topic id in the answer: the proposal was made and may still commit.
                    if getattr(r, "topic_id", ""):
                        unknown.setdefault(r.name, r.topic_id)
                    retry.append(r.name)
                    log.info("%s %r: %s (%s); retrying against the active controller", method, r.name,
                             errors.code_name(r.error_code), r.error_message)
                else:
                    final[r.name] = r
            pending = [n for n in pending if n in retry]
            if pending:
                # The controller that answered is not (or no longer) the active one: find it again.
                self.controller.forget_active_controller()
                low, high = _RETRY_BACKOFF_S
                time.sleep(min(high, low * (2 ** min(attempt, 6)),
                               max(0.0, deadline - time.monotonic() - _MIN_ATTEMPT_S)))
                attempt += 1
        return final, unknown

    @staticmethod
    def _check_results(results: Iterable[Any], raise_on_error: bool) -> dict[str, errors.BrookError | None]:
        out: dict[str, errors.BrookError | None] = {}
        for r in results:
            out[r.name] = errors.error_for(r.error_code, r.error_message) if r.error_code else None
        if raise_on_error:
            for err in out.values():
                if err is not None:
                    raise err
        return out

    # ---- topics ----
    def create_topics(self, topics: Iterable[NewTopic], *, validate_only: bool = False,
                      timeout_ms: int | None = None, raise_on_error: bool = True,
                      wait_for_leaders: bool = True) -> dict[str, errors.BrookError | None]:
        """Create topics; {name: None or the error}. Waits (by default) until every partition has a leader."""
        by_name = {t.name: t for t in topics}
        # One id per topic for this call, sent again on every retry: an attempt that created the topic
        # but whose answer was lost (a controller failover, a dropped connection) is then answered as
        # done, not TOPIC_ALREADY_EXISTS.
        request_ids = {name: uuid.uuid4().hex for name in by_name}

        def build(names: list[str], remaining_ms: int) -> controller_pb2.CreateTopicsRequest:
            return controller_pb2.CreateTopicsRequest(
                validate_only=validate_only, timeout_ms=remaining_ms,
                topics=[controller_pb2.CreatableTopic(
                    name=t.name, num_partitions=t.num_partitions, replication_factor=t.replication_factor,
                    configs={k: str(v) for k, v in t.configs.items()},
                    assignments=[controller_pb2.ReplicaList(replicas=r) for r in t.replica_assignments or []],
                    request_id="" if validate_only else request_ids[t.name])
                    for t in (by_name[n] for n in names)])

        results, unknown = self._call_topics("CreateTopics", list(by_name), build, timeout_ms)
        for name, r in results.items():
            if r.error_code == errors.ErrorCode.TOPIC_ALREADY_EXISTS and name in unknown \
                    and r.topic_id == unknown[name]:
                log.info("CreateTopics %r: created by our own earlier attempt (topic id %s)", name, r.topic_id)
                r.error_code, r.error_message = errors.ErrorCode.NONE, ""
        result = self._check_results(results.values(), raise_on_error)
        if wait_for_leaders and not validate_only:
            created = [name for name, err in result.items() if err is None]
            self.wait_for_topics(created, timeout_ms=timeout_ms)
            if created:
                self.wait_for_brokers(self.cluster.metadata_snapshot().version, timeout_ms=timeout_ms)
        return result

    def create_topic(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                     configs: Mapping[str, str] | None = None) -> None:
        self.create_topics([NewTopic(name, num_partitions, replication_factor, dict(configs or {}))])

    def wait_for_topics(self, names: Iterable[str], *, timeout_ms: int | None = None,
                        min_partitions: Mapping[str, int] | None = None) -> None:
        """Poll broker metadata until each topic is known with a leader for every partition
        (and at least ``min_partitions[name]`` partitions, after create_partitions)."""
        names = list(names)
        wanted = dict(min_partitions or {})
        deadline = time.monotonic() + (timeout_ms or self.request_timeout_ms) / 1000
        while names:
            meta = self.cluster.metadata(names, refresh=True)
            names = [n for n in names if n not in meta.topics or meta.topics[n].error_code
                     or len(meta.topics[n].partitions) < max(1, wanted.get(n, 1))
                     or any(p.leader < 0 for p in meta.topics[n].partitions.values())]
            if not names:
                return
            if time.monotonic() >= deadline:
                raise errors.RequestTimedOutError(f"topics {names} have no leader for every partition yet")
            time.sleep(0.05)

    def wait_for_brokers(self, version: int | None = None, *, timeout_ms: int | None = None) -> list[int]:
        """Wait until every live broker has applied metadata ``version`` (default: the quorum's, read from
        the active controller; without DESCRIBE on the cluster, the newest this client has seen), so that any
        client, whichever broker it asks, sees what that version holds. Brokers apply the quorum's
        metadata a few milliseconds apart. A broker whose Metadata call fails (down, stopped, refusing)
        is not waited for; its id is returned. At the deadline brokers still behind are logged and the wait
        ends: what was asked of the quorum is done, only not yet known everywhere."""
        budget_ms = timeout_ms or self.request_timeout_ms
        deadline = time.monotonic() + budget_ms / 1000
        if version is None:
            try:
                version = self.describe_cluster().metadata_version
            except errors.BrookError as e:
                if e.code != errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                    raise
        live = self.cluster.metadata([], refresh=True, timeout_ms=budget_ms).brokers.values()  # brokers only
        behind = {b.node_id: b.address for b in live if not b.fenced}
        unanswered: list[int] = []
        seen: dict[int, int] = {}
        next_look = time.monotonic() + FENCED_LOOK_S
        if version is None:
            version = self.cluster.metadata_snapshot().version
        while behind:
            for node_id, address in list(behind.items()):
                remaining_s = deadline - time.monotonic()
                try:
                    resp = self.cluster.stub_for_address(address).Metadata(
                        broker_pb2.MetadataRequest(), timeout=max(0.05, min(BROKER_ANSWER_S, remaining_s)))
                except grpc.RpcError as exc:
                    log.info("broker %d (%s) failed Metadata (%s): not waiting for it to reach metadata "
                             "version %d", node_id, address, exc.code(), version)
                    unanswered.append(node_id)
                    del behind[node_id]
                    continue
                seen[node_id] = resp.metadata_version
                if resp.metadata_version >= version:
                    del behind[node_id]
            if not behind:
                break
            now = time.monotonic()
            if now >= deadline:
                log.warning("brokers %s are still behind metadata version %d after %d ms (at %s)", sorted(behind),
                            version, budget_ms, {n: seen.get(n) for n in sorted(behind)})
                break
            if now >= next_look:
                # A broker cut off from the controllers answers but stays behind until the controller
                # fences it; the brokers that are up to date then show it fenced.
                next_look = now + FENCED_LOOK_S
                try:
                    current = self.cluster.metadata([], refresh=True,
                                                    timeout_ms=as_timeout_ms(deadline - now)).brokers
                except errors.BrookError as e:  # no broker answered in time: the next round asks again
                    log.debug("wait_for_brokers: no metadata to look for fenced brokers in: %s", e)
                    current = None
                for node_id in [n for n in behind if current is not None and (n not in current or current[n].fenced)]:
                    log.info("broker %d is fenced or gone: not waiting for it to reach metadata version %d",
                             node_id, version)
                    del behind[node_id]
            time.sleep(0.01)
        return unanswered

    def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None,
                      raise_on_error: bool = True) -> dict[str, errors.BrookError | None]:
        results, unknown = self._call_topics(
            "DeleteTopics", list(names),
            lambda pending, remaining_ms: controller_pb2.DeleteTopicsRequest(names=pending, timeout_ms=remaining_ms),
            timeout_ms)
        for name, r in results.items():
            if r.error_code == errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and name in unknown:
                r.error_code, r.error_message = errors.ErrorCode.NONE, ""  # our earlier attempt deleted it
        self.cluster.request_update()
        return self._check_results(results.values(), raise_on_error)

    def create_partitions(self, new_totals: Mapping[str, int], *, validate_only: bool = False,
                          timeout_ms: int | None = None, raise_on_error: bool = True,
                          wait_for_leaders: bool = True) -> dict[str, errors.BrookError | None]:
        """Grow topics to ``{name: new total partition count}`` (waits until brokers serve them)."""
        totals = dict(new_totals)
        results, unknown = self._call_topics(
            "CreatePartitions", list(totals),
            lambda pending, remaining_ms: controller_pb2.CreatePartitionsRequest(
                validate_only=validate_only, timeout_ms=remaining_ms,
                topics=[controller_pb2.CreatePartitionsTopic(name=n, count=totals[n]) for n in pending]),
            timeout_ms)
        for name, r in results.items():
            if r.error_code == errors.ErrorCode.INVALID_PARTITIONS and name in unknown \
                    and f"has {totals[name]} partitions;" in r.error_message:
                r.error_code, r.error_message = errors.ErrorCode.NONE, ""  # our earlier attempt grew it
        self.cluster.request_update()
        result = self._check_results(results.values(), raise_on_error)
        if wait_for_leaders and not validate_only:
            grown = {n: c for n, c in new_totals.items() if result.get(n) is None}
            self.wait_for_topics(list(grown), timeout_ms=timeout_ms, min_partitions=grown)
            if grown:
                self.wait_for_brokers(self.cluster.metadata_snapshot().version, timeout_ms=timeout_ms)
        return result

    def list_topics(self, *, include_internal: bool = False) -> list[str]:
        meta = self.cluster.metadata(refresh=True)
        return sorted(n for n, t in meta.topics.items() if include_internal or not t.is_internal)

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicMetadata]:
        """Partitions with leader, epoch, replicas and ISR; raises the error of an unknown topic."""
        wanted = None if names is None else list(names)
        meta = self.cluster.metadata(wanted, refresh=True)
        if wanted is None:
            return dict(meta.topics)
        out = {}
        for name in wanted:
            info = meta.topics.get(name)
            if info is None or info.error_code:
                code = info.error_code if info else errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                raise errors.error_for(code, (info.error_message if info else "") or f"topic {name!r}")
            out[name] = info
        return out

    # ---- SCRAM users (Kafka's AlterUserScramCredentials / DescribeUserScramCredentials) ----
    def create_user(self, user: str, password: str, *, mechanisms: Iterable[str] = ("SCRAM-SHA-256", "SCRAM-SHA-512"),
                    iterations: int = 4096) -> None:
        """Create a user or change its password. The password is salted here: only salt and keys travel."""
        from metadata_quorum.security_service import credential_record, salted_credential

        request = security_pb2.UpsertScramCredentialsRequest(credentials=[
            credential_record(salted_credential(user, m, password, iterations)) for m in mechanisms])
        self._raise_items(self._call("UpsertScramCredentials", request).results)

    def delete_user(self, user: str, mechanism: str = "") -> None:
        """Delete a user's credentials (every mechanism by default); RESOURCE_NOT_FOUND if it has none."""
        request = security_pb2.DeleteScramCredentialsRequest(
            items=[security_pb2.DeleteScramCredentialsRequest.Item(user=user, mechanism=mechanism)])
        self._raise_items(self._call("DeleteScramCredentials", request).results)

    def list_users(self, users: Iterable[str] = ()) -> dict[str, list[tuple[str, int]]]:
        """user -> [(mechanism, iterations)]; passwords and keys are never returned."""
        response = self._call("DescribeUsers", security_pb2.DescribeUsersRequest(users=list(users)))
        return {u.user: [(m.mechanism, m.iterations) for m in u.mechanisms] for u in response.users}

    @staticmethod
    def _raise_items(results: Iterable[Any]) -> None:
        for r in results:
            errors.raise_for(r.error_code, r.error_message)

    # ---- ACLs ----
    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        request = security_pb2.CreateAclsRequest(acls=[_acl_proto(b) for b in bindings])
        self._call("CreateAcls", request)

    def describe_acls(self, **filter_fields: str) -> list[AclBinding]:
        """Bindings matching a filter (resource_type, resource_name, pattern_type incl. MATCH, principal, ...)."""
        response = self._call("DescribeAcls", security_pb2.DescribeAclsRequest(
            filter=security_pb2.AclFilter(**filter_fields)))
        return [_acl_binding(a) for a in response.acls]

    def delete_acls(self, filters: Iterable[Mapping[str, str]]) -> list[AclBinding]:
        """Delete every binding matching any filter; returns the deleted ones."""
        response = self._call("DeleteAcls", security_pb2.DeleteAclsRequest(
            filters=[security_pb2.AclFilter(**dict(f)) for f in filters]))
        return [_acl_binding(a) for a in response.acls]

    # ---- client quotas ----
    def alter_client_quotas(self, entity: str, *, set: Mapping[str, float] | None = None,  # noqa: A002
                            remove: Iterable[str] = ()) -> dict[str, float]:
        """Set/remove quotas of ``User:<name>`` or ``<default>``; returns the entity's quotas after."""
        response = self._call("AlterClientQuotas", security_pb2.AlterClientQuotasRequest(
            entity=entity, set={k: float(v) for k, v in (set or {}).items()}, remove=list(remove)))
        return next((dict(q.values) for q in response.quotas), {})

    def describe_client_quotas(self, entity: str = "") -> dict[str, dict[str, float]]:
        response = self._call("DescribeClientQuotas", security_pb2.DescribeClientQuotasRequest(entity=entity))
        return {q.entity: dict(q.values) for q in response.quotas}

    # ---- configs ----
    def describe_configs(self, topics: Iterable[str]) -> dict[str, dict[str, ConfigEntry]]:
        response = self._call("DescribeConfigs", controller_pb2.DescribeConfigsRequest(topics=list(topics)))
        out: dict[str, dict[str, ConfigEntry]] = {}
        for r in response.results:
            errors.raise_for(r.error_code, r.error_message or f"topic {r.topic!r}")
            out[r.topic] = {e.name: ConfigEntry(e.name, e.value, e.is_default, e.documentation) for e in r.entries}
        return out

    def alter_configs(self, topic: str, *, set: Mapping[str, str] | None = None,  # noqa: A002 - Kafka's word
                      delete: Iterable[str] = (), validate_only: bool = False) -> None:
        """Incrementally set and/or reset (to default) topic configs."""
        to_set = {k: str(v) for k, v in (set or {}).items()}
        to_delete = list(delete)
        # Setting and deleting keys is idempotent: a retry after an unknown outcome is harmless.
        results, _ = self._call_topics("AlterConfigs", [topic], lambda _p, _ms: controller_pb2.AlterConfigsRequest(
            validate_only=validate_only, resources=[
                controller_pb2.AlterConfigsResource(topic=topic, set=to_set, delete=to_delete)]), None)
        self._check_results(results.values(), True)

    # ---- cluster / quorum ----
    def describe_cluster(self) -> ClusterDescription:
        r = self._call("DescribeCluster", controller_pb2.DescribeClusterRequest())
        brokers = []
        for b in r.brokers:
            endpoint = next((e for e in b.endpoints if e.name == "BROKER"), b.endpoints[0] if b.endpoints else None)
            brokers.append(BrokerMetadata(b.node_id, endpoint.host if endpoint else "", endpoint.port if endpoint else -1,
                                          b.rack, b.fenced))
        return ClusterDescription(r.cluster_id, r.active_controller_id, r.metadata_version, brokers,
                                  len(r.topics), len(r.partitions), [b.node_id for b in r.brokers if b.fenced])

    def describe_quorum(self) -> QuorumDescription:
        """The quorum from the active controller, or (none active) from any voter that answers."""
        r = self.controller.describe_quorum(timeout_s=self.request_timeout_ms / 1000)
        voters = [QuorumVoter(v.node_id, v.raft_address, v.log_end_index, v.lag, v.last_contact_ms_ago, v.is_leader)
                  for v in r.voters]
        return QuorumDescription(r.leader_id, r.term, r.commit_index, r.metadata_version, voters, r.responder_id,
                                 r.responder_is_active)

    def elect_leaders(self, election_type: str = "preferred",
                      partitions: Iterable[str | tuple[str, int]] | None = None, *,
                      timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, errors.BrookError | None]]:
        """Kafka's ElectLeaders. ``partitions``: topic names (every partition of them) and (topic, partition)
        pairs; None means every partition of the cluster, and then only the partitions an election was
        tried for are answered. Returns {tp: (leader after the request, None or the error)}: per-partition
        outcomes such as ELECTION_NOT_NEEDED or PREFERRED_LEADER_NOT_AVAILABLE are not raised.

        ``"unclean"`` elects a live replica outside the ISR of a leaderless partition: records the lost
        in-sync replicas had committed may be gone for good. Use it only when they cannot come back."""
        kind = election_type.strip().lower()
        if kind not in ("preferred", "unclean"):
            raise errors.InvalidRequestError(f"election type must be 'preferred' or 'unclean', not {election_type!r}")
        request = controller_pb2.ElectLeadersRequest(
            election_type=controller_pb2.UNCLEAN if kind == "unclean" else controller_pb2.PREFERRED,
            timeout_ms=timeout_ms or self.request_timeout_ms)
        if partitions is not None:
            by_topic: dict[str, list[int] | None] = {}
            for item in partitions:
                if isinstance(item, str):
                    by_topic[item] = None
                else:
                    topic, index = item
                    if by_topic.get(topic, []) is not None:
                        by_topic.setdefault(topic, []).append(int(index))  # type: ignore[union-attr]
            if not by_topic:
                raise errors.InvalidRequestError("no partitions named: pass None to elect for every partition")
            for topic, indexes in by_topic.items():
                request.topic_partitions.add(topic=topic, partitions=sorted(set(indexes or [])))
        response = self._call("ElectLeaders", request, timeout_ms)
        self.cluster.request_update()
        return {TopicPartition(r.topic, r.partition): (
            r.leader, errors.error_for(r.error_code, r.error_message) if r.error_code else None)
            for r in response.results}

    def alter_partition_reassignments(self, moves: Mapping[TopicPartition, list[int] | None], *,
                                      timeout_ms: int | None = None, allow_replication_factor_change: bool = True,
                                      ) -> dict[TopicPartition, errors.BrookError | None]:
        """Kafka's alterPartitionReassignments: {tp: target replicas (preferred leader first), or None to cancel
        the move in progress}. The new replicas copy the log as followers; the controller drops the leaving
        ones once every target replica is in sync. A target with more or fewer replicas than the partition has
        changes its replication factor (``brook.metadata.version`` 5), unless ``allow_replication_factor_change``
        is False (KIP-860): then it is refused. Returns {tp: None or the error}."""
        request = controller_pb2.AlterPartitionReassignmentsRequest(
            timeout_ms=timeout_ms or self.request_timeout_ms,
            keep_replication_factor=not allow_replication_factor_change)
        for tp, target in moves.items():
            tp = TopicPartition(*tp)
            request.partitions.add(topic=tp.topic, partition=tp.partition, replicas=list(target or []),
                                   cancel=target is None)
        response = self._call("AlterPartitionReassignments", request, timeout_ms)
        self.cluster.request_update()
        return {TopicPartition(r.topic, r.partition): errors.error_for(r.error_code, r.error_message)
                if r.error_code else None for r in response.results}

    def list_partition_reassignments(self, partitions: Iterable[str | tuple[str, int]] | None = None
                                     ) -> dict[TopicPartition, PartitionReassignment]:
        """The moves in progress (of the named topics / partitions, or all)."""
        request = controller_pb2.ListPartitionReassignmentsRequest()
        for item in partitions or ():
            if isinstance(item, str):
                request.topic_partitions.add(topic=item)
            else:
                request.topic_partitions.add(topic=item[0], partitions=[int(item[1])])
        response = self._call("ListPartitionReassignments", request)
        return {TopicPartition(r.topic, r.partition): PartitionReassignment(
            list(r.replicas), list(r.adding_replicas), list(r.removing_replicas), list(r.isr), r.leader)
            for r in response.reassignments}

    def unregister_broker(self, broker_id: int) -> None:
        """Release a stopped broker's id once no partition names it (after its replicas moved)."""
        self._call("UnregisterBroker", controller_pb2.UnregisterBrokerRequest(broker_id=broker_id))
        self.cluster.request_update()

    def describe_cluster_configs(self) -> dict[str, ConfigEntry]:
        """The dynamic cluster configs (every key that can change at runtime), with where each value comes
        from: ``dynamic`` (set in the quorum), ``node`` (the answering controller's file) or ``default``."""
        r = self._call("DescribeClusterConfigs", controller_pb2.DescribeClusterConfigsRequest())
        return {e.name: ConfigEntry(e.name, e.value, e.source != "dynamic", e.documentation, e.source)
                for e in r.entries}

    def alter_cluster_configs(self, *, set: Mapping[str, str] | None = None,  # noqa: A002 - Kafka's word
                              delete: Iterable[str] = (), validate_only: bool = False) -> None:
        """Change cluster-wide broker configs at runtime (every broker applies them at once)."""
        self._call("AlterClusterConfigs", controller_pb2.AlterClusterConfigsRequest(
            set={k: str(v) for k, v in (set or {}).items()}, delete=list(delete), validate_only=validate_only))

    # ---- finalized features ----
    def describe_features(self) -> FeatureDescription:
        """The finalized brook.metadata.version, and the highest level each voter's and broker's release supports."""
        r = self._call("DescribeFeatures", controller_pb2.DescribeFeaturesRequest())
        return FeatureDescription(r.name, r.finalized_level, r.supported_min, r.supported_max, r.metadata_version,
                                  [NodeFeatureSupport(n.node_id, n.role, n.supported_max, n.problem) for n in r.nodes])

    def update_features(self, level: int, *, name: str = "brook.metadata.version", validate_only: bool = False) -> int:
        """Raise the finalized level (never lowered); FEATURE_UPDATE_FAILED names the nodes whose release does not
        support it. Returns the finalized level (unchanged with validate_only)."""
        r = self._call("UpdateFeatures", controller_pb2.UpdateFeaturesRequest(name=name, level=level,
                                                                              validate_only=validate_only))
        return int(r.finalized_level)

    # ---- offsets ----
    def list_offsets(self, specs: Mapping[TopicPartition, str | int]) -> dict[TopicPartition, tuple[int, int]]:
        """{tp: "earliest"|"latest"|"max_timestamp"|timestamp_ms} -> {tp: (offset, timestamp)}."""
        timestamps = {}
        for tp, spec in specs.items():
            if isinstance(spec, str):
                if spec not in OFFSET_SPECS:
                    raise errors.InvalidRequestError(f"offset spec must be one of {sorted(OFFSET_SPECS)} or ms")
                timestamps[TopicPartition(*tp)] = OFFSET_SPECS[spec]
            else:
                timestamps[TopicPartition(*tp)] = int(spec)
        return self.cluster.list_offsets(timestamps)

    def delete_records(self, before: Mapping[TopicPartition, int], *, timeout_ms: int | None = None
                       ) -> dict[TopicPartition, tuple[int, errors.BrookError | None]]:
        """Kafka's deleteRecords: {tp: offset} deletes every record before ``offset`` (-1: the high watermark,
        i.e. everything committed). Returns {tp: (low watermark, None or the error)}; the low watermark is
        the partition's new earliest offset once every in-sync replica has followed. Offsets past the high
        watermark are refused with OFFSET_OUT_OF_RANGE and change nothing."""
        offsets = {TopicPartition(*tp): int(offset) for tp, offset in before.items()}

        def send(leader: int, tps: list[TopicPartition], remaining_s: float) -> Iterable[Any]:
            request = broker_pb2.DeleteRecordsRequest(timeout_ms=int(remaining_s * 1000), partitions=[
                broker_pb2.DeleteRecordsPartition(topic=tp.topic, partition=tp.partition, offset=offsets[tp])
                for tp in tps])
            return self.cluster.broker_stub(leader).DeleteRecords(request, timeout=remaining_s + 1).partitions
        return self._on_leaders("DeleteRecords", offsets, send, lambda r: r.low_watermark, -1, timeout_ms)

    def describe_producers(self, partitions: Iterable[tuple[str, int]], *, timeout_ms: int | None = None
                           ) -> dict[TopicPartition, list[ProducerState] | errors.BrookError]:
        """Kafka's describeProducers: the idempotent producers each partition's leader tracks (READ on the topic).
        {tp: [ProducerState] by producer id, or the error}."""
        wanted = {TopicPartition(*tp): None for tp in partitions}

        def send(leader: int, tps: list[TopicPartition], remaining_s: float) -> Iterable[Any]:
            request = broker_pb2.DescribeProducersRequest(partitions=[
                broker_pb2.DescribeProducersPartition(topic=tp.topic, partition=tp.partition) for tp in tps])
            return self.cluster.broker_stub(leader).DescribeProducers(request, timeout=remaining_s).partitions
        found = self._on_leaders("DescribeProducers", wanted, send, lambda r: [
            ProducerState(p.producer_id, p.producer_epoch, p.last_sequence, p.last_timestamp, p.coordinator_epoch,
                          p.current_txn_start_offset) for p in r.producers],
            [], timeout_ms)
        return {tp: value if err is None else err for tp, (value, err) in found.items()}

    def _on_leaders(self, method: str, pending: dict[TopicPartition, Any],
                    send: Callable[[int, list[TopicPartition], float], Iterable[Any]], value: Callable[[Any], T],
                    failed_value: T, timeout_ms: int | None) -> dict[TopicPartition, tuple[T, errors.BrookError | None]]:
        """Each partition of ``pending`` asked of its leader (``send(leader, partitions, seconds left)`` returns the
        per-partition answers), again after a metadata refresh while the error is retriable, until ``timeout_ms``
        (the request timeout by default). {tp: (value(answer), None) or (failed_value, error)}."""
        pending = dict(pending)
        deadline = time.monotonic() + (timeout_ms or self.request_timeout_ms) / 1000
        result: dict[TopicPartition, tuple[T, errors.BrookError | None]] = {}
        attempt = 0
        while pending:
            by_leader, failed = self.cluster.group_by_leader(pending)
            for tp, exc in failed.items():
                if not exc.retriable or time.monotonic() >= deadline:
                    result[tp] = (failed_value, exc)
                    del pending[tp]
            for leader, tps in by_leader.items():
                remaining_s = max(0.05, deadline - time.monotonic())
                try:
                    answers = list(send(leader, tps, remaining_s))
                except grpc.RpcError as exc:
                    err = rpc_error(exc, f"{method} to broker {leader}")
                    if not err.retriable or time.monotonic() >= deadline:
                        for tp in tps:
                            result[tp] = (failed_value, err)
                            del pending[tp]
                    continue
                for r in answers:
                    tp = TopicPartition(r.topic, r.partition)
                    if tp not in pending:
                        continue
                    err = errors.error_for(r.error_code, r.error_message) if r.error_code else None
                    if err is None or not err.retriable or time.monotonic() >= deadline:
                        result[tp] = (value(r) if err is None else failed_value, err)
                        del pending[tp]
            if pending:
                self.cluster.request_update()
                time.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5), max(0.0, deadline - time.monotonic())))
                attempt += 1
        return result

    def describe_log_dirs(self, brokers: Iterable[int] | None = None, topics: Iterable[str] = ()
                          ) -> dict[int, list[LogDirInfo] | errors.BrookError]:
        """Each broker's log directories and the partition logs in them (all brokers by default)."""
        ids = sorted(self.cluster.metadata(refresh=True).brokers) if brokers is None else sorted(set(brokers))
        request = broker_pb2.DescribeLogDirsRequest(topics=sorted(set(topics)))
        out: dict[int, list[LogDirInfo] | errors.BrookError] = {}
        for node_id in ids:
            try:
                r = self.cluster.broker_stub(node_id).DescribeLogDirs(request, timeout=self.request_timeout_ms / 1000)
            except grpc.RpcError as exc:
                out[node_id] = rpc_error(exc, f"DescribeLogDirs to broker {node_id}")
                continue
            except errors.BrookError as exc:  # an unknown broker id
                out[node_id] = exc
                continue
            if r.error_code:
                out[node_id] = errors.error_for(r.error_code, r.error_message)
                continue
            out[node_id] = [LogDirInfo(
                d.path, errors.error_for(d.error_code, d.error_message) if d.error_code else None, d.total_bytes,
                d.usable_bytes, [ReplicaInfo(p.topic, p.partition, p.size_bytes, p.offset_lag, p.log_start_offset,
                                             p.high_watermark, p.log_end_offset, p.is_leader, p.segments)
                                 for p in d.partitions]) for d in r.dirs]
        return out

    # ---- groups ----
    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Groups of every broker's coordinator, merged."""
        request = group_pb2.ListGroupsRequest(states=list(states))
        found: dict[str, GroupListing] = {}
        for broker in self.cluster.metadata(refresh=True).brokers.values():
            try:
                r = group_stub(self.cluster, broker.address).ListGroups(request, timeout=self.request_timeout_ms / 1000)
            except grpc.RpcError as exc:
                raise rpc_error(exc, f"ListGroups on broker {broker.node_id}") from exc
            errors.raise_for(r.error_code, r.error_message)
            for g in r.groups:
                found[g.group_id] = GroupListing(g.group_id, g.protocol_type, g.state, g.coordinator_id,
                                                 g.group_type or "classic")
        return sorted(found.values(), key=lambda g: g.group_id)

    def _group(self, group_id: str) -> GroupCoordinatorClient:
        """The coordinator client of ``group_id`` (remembered, so repeated calls skip FindCoordinator)."""
        coord = self._coordinators.get(group_id)
        if coord is None:
            if len(self._coordinators) >= COORDINATOR_CACHE_MAX:
                self._coordinators.pop(next(iter(self._coordinators)))  # oldest first
            coord = GroupCoordinatorClient(self.cluster, group_id, request_timeout_ms=self.request_timeout_ms)
            self._coordinators[group_id] = coord
        return coord

    def _group_call(self, group_id: str, method: str, request: Any, results: Callable[[Any], Iterable[Any]],
                    timeout_ms: int | None = None) -> Any:
        """Send a per-group request to ``group_id``'s coordinator. Transport and top-level errors are
        retried by the coordinator client; a per-group NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS or
        COORDINATOR_NOT_AVAILABLE in ``results(response)`` is retried here, finding the coordinator
        again, with backoff, until the request timeout (then the last such error is raised)."""
        coord = self._group(group_id)

        def attempt(timeout_s: float) -> Any:
            response = coord.call(method, request, timeout_ms=as_timeout_ms(timeout_s), check=False)
            for r in results(response):
                if r.error_code in _COORDINATOR_RETRY_CODES:
                    if r.error_code != errors.ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                        coord.forget()  # loading: same coordinator, just not ready yet
                    log.debug("%s for group %r: %s; retrying", method, group_id, errors.code_name(r.error_code))
                    raise errors.error_for(r.error_code, r.error_message or f"{method} for group {group_id!r}")
            return response

        return self.cluster.with_retries(attempt, timeout_ms=timeout_ms or self.request_timeout_ms)

    def describe_groups(self, group_ids: Iterable[str], *, include_offsets: bool = True
                        ) -> dict[str, GroupDescription]:
        out = {}
        for gid in group_ids:
            r = self._group_call(gid, "DescribeGroups", group_pb2.DescribeGroupsRequest(
                group_ids=[gid], include_offsets=include_offsets), lambda resp: resp.groups)
            for g in r.groups:
                errors.raise_for(g.error_code, g.error_message or f"group {g.group_id!r}")
                out[g.group_id] = _group_description(g)
        return out

    def delete_groups(self, group_ids: Iterable[str], *, raise_on_error: bool = True
                      ) -> dict[str, errors.BrookError | None]:
        out: dict[str, errors.BrookError | None] = {}
        for gid in group_ids:
            r = self._group_call(gid, "DeleteGroups", group_pb2.DeleteGroupsRequest(group_ids=[gid]),
                                 lambda resp: resp.results)
            for res in r.results:
                out[res.group_id] = errors.error_for(res.error_code, res.error_message) if res.error_code else None
        if raise_on_error:
            for err in out.values():
                if err is not None:
                    raise err
        return out

    def remove_group_members(self, group_id: str, instance_ids: Iterable[str]) -> None:
        """Remove static members (by ``group.instance.id``) from a group now, instead of after their session
        timeout: the group rebalances without them (Kafka's ``removeMembersFromConsumerGroup``). Raises the
        first member's error (UNKNOWN_MEMBER_ID for an instance id not in the group); the others still go."""
        ids = [str(i) for i in instance_ids]
        if not ids or any(not i for i in ids):
            raise errors.InvalidRequestError(f"name the instance ids to remove, got {ids}")
        r = self._group_call(group_id, "LeaveGroup", group_pb2.LeaveGroupRequest(
            group_id=group_id, reason="removed by an admin",
            members=[group_pb2.LeaveGroupMember(group_instance_id=i) for i in ids]), lambda resp: [resp])
        errors.raise_for(r.error_code, r.error_message or f"group {group_id!r}")
        for m in r.members:
            errors.raise_for(m.error_code, f"group {group_id!r}: instance {m.group_instance_id!r} "
                                           f"({errors.code_name(m.error_code)})")

    def list_group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        found = self._group(group_id).committed(None)
        return {tp: om for tp, om in found.items() if om is not None}

    def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Set committed offsets of an (empty) group explicitly."""
        self.reset_group_offsets(group_id, [(tp.topic, tp.partition, "offset", o) for tp, o in offsets.items()])

    def reset_group_offsets(self, group_id: str, specs: Iterable[tuple[str, int, str, int]], *,
                            dry_run: bool = False) -> dict[TopicPartition, tuple[int, int]]:
        """specs: (topic, partition or -1 for all, kind, value) with kind in
        earliest | latest | timestamp (value ms) | offset (value) | shift (value added).
        Returns {tp: (previous offset, new offset)}."""
        kinds = {"offset": group_pb2.RESET_EXPLICIT, "earliest": group_pb2.RESET_EARLIEST,
                 "latest": group_pb2.RESET_LATEST, "timestamp": group_pb2.RESET_TIMESTAMP,
                 "shift": group_pb2.RESET_SHIFT_BY}
        pb_specs = []
        for topic, partition, kind, value in specs:
            if kind not in kinds:
                raise errors.InvalidRequestError(f"reset kind must be one of {sorted(kinds)}, got {kind!r}")
            pb_specs.append(group_pb2.OffsetResetSpec(topic=topic, partition=partition, kind=kinds[kind],
                                                      value=int(value)))
        r = self._group(group_id).call("AlterGroupOffsets", group_pb2.AlterGroupOffsetsRequest(
            group_id=group_id, specs=pb_specs, dry_run=dry_run))
        out = {}
        for p in r.partitions:
            errors.raise_for(p.error_code, p.error_message or f"{p.topic}-{p.partition}")
            out[TopicPartition(p.topic, p.partition)] = (p.previous_offset, p.offset)
        return out

    def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        r = self._group(group_id).call("OffsetDelete", group_pb2.OffsetDeleteRequest(
            group_id=group_id, partitions=[group_pb2.TopicPartitionRef(topic=t, partition=p) for t, p in partitions]))
        for p in r.partitions:
            errors.raise_for(p.error_code, p.error_message or f"{p.topic}-{p.partition}")

    def close(self) -> None:
        if self._controller is not None:
            self._controller.close()
        self.cluster.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _group_description(g: group_pb2.DescribedGroup) -> GroupDescription:
    members = [MemberDescription(m.member_id, m.client_id, m.client_host, list(m.subscribed_topics),
                                 [TopicPartition(r.topic, r.partition) for r in m.assigned_partitions],
                                 m.group_instance_id, m.subscribed_topic_regex)
               for m in g.members]
    offsets = {TopicPartition(o.topic, o.partition): GroupOffset(o.committed_offset, o.log_end_offset, o.lag,
                                                                 o.member_id, o.metadata) for o in g.offsets}
    return GroupDescription(g.group_id, g.state, g.protocol_type, g.protocol_name, g.generation_id, g.leader,
                            g.coordinator_id, members, offsets, g.group_type or "classic")


def _acl_proto(b: AclBinding) -> security_pb2.AclBinding:
    return security_pb2.AclBinding(resource_type=b.resource_type, resource_name=b.resource_name,
                                   pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                                   operation=b.operation, permission=b.permission)


def _acl_binding(a: security_pb2.AclBinding) -> AclBinding:
    return AclBinding(a.resource_type, a.resource_name, a.pattern_type, a.principal, a.host, a.operation,
                      a.permission)
