"""Kafka API handlers: each translates a kio request into the protobuf request of the same
Brook RPC, calls the servicer that serves gRPC clients (so every rule — validation, ACLs,
quotas, admission, purgatories — is the one rule), and translates the answer back.

Handlers are written once for every version they serve: they read request fields with
``_get`` (fields a version lacks take their Kafka default) and build responses with
``codec.response`` (fields a version lacks are dropped). ``SUPPORTED`` is what ApiVersions
advertises; an API or version not in it is never parsed (the connection is closed, as
Kafka does for a request it cannot read).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from broker import authorizer as authz
from broker import consumer_groups
from broker.admission import refuse_oversized
from broker.fetch_answer import answer_of
from broker.group_service import join_answer_of
from broker.group_state import GroupState
from broker.kafka_wire import admin_apis, codec, txn_apis, user_apis
from broker.kafka_wire.codec import get as _get
from broker.kafka_wire.codec import get_ms as _ms
from broker.kafka_wire.context import Handler, KafkaCallContext
from broker.kafka_wire.fetch_sessions import CachedPartition, FetchSessions, Outcome, Plan
from broker.log_limits import ThrottledWarning
from client.types import TopicPartition
from metadata_quorum import features
from proto import broker_pb2, errors, group_pb2
from proto.errors import ErrorCode
from replication.partition import READ_COMMITTED
from storage.record_batch import CODEC_ZSTD, read_header

log = logging.getLogger(__name__)


UNKNOWN_TOPIC_ID = 100  # Kafka's code (KIP-516): a Metadata v12 topic id no topic has

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP = 8, 9, 10, 11
HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 12, 13, 14, 15, 16
SASL_HANDSHAKE, API_VERSIONS, INIT_PRODUCER_ID, OFFSET_FOR_LEADER_EPOCH = 17, 18, 22, 23
SASL_AUTHENTICATE, DELETE_GROUPS, OFFSET_DELETE = 36, 42, 47
DESCRIBE_TOPIC_PARTITIONS = 75
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
CLIENT_ID_LOGGED_MAX = 100  # a client id or topic name in a log line: the first characters only (a client
TOPIC_LOGGED_MAX = 100  # chooses them, up to 32 KB)
# The most partitions one DescribeTopicPartitions answer holds (Kafka's max.request.partition.size.limit default).
DESCRIBE_TOPIC_PARTITIONS_LIMIT = 2000

# api key -> (min, max) version served. The floors are Kafka 4's (what kio has schemas for);
# the ceilings stop before versions that need what Brook lacks (topic ids in Fetch/Produce,
# KIP-848's consumer protocol: OffsetFetch v9's member epoch).
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 10),  # v8: earliest local (-4), v9: latest tiered (-5), v10: a timeout for remote reads
    METADATA: (0, 12),
    OFFSET_COMMIT: (2, 9),  # v9 (KIP-848): a consumer-protocol member commits at its member epoch
    OFFSET_FETCH: (1, 9),  # v9: a KIP-848 member's id and epoch, checked as Kafka does
    FIND_COORDINATOR: (0, 4),
    JOIN_GROUP: (0, 8),  # v8 (KIP-800): the client's reason, logged with the rebalance it starts
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),  # v5 (KIP-800): each member's reason, logged
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 6),  # v6 (KIP-1043): a group that does not exist is GROUP_ID_NOT_FOUND
    LIST_GROUPS: (0, 5),  # v5 (KIP-848): the types filter, and each group's type (all are classic)
    SASL_HANDSHAKE: (0, 1),  # as Kafka 4; librdkafka 2.0 (Debian's kcat) uses SASL only if v0 is in the range
    API_VERSIONS: (0, 4),  # v4 (KAFKA-17011) lets a feature's lowest level be 0: Brook's is 1, the answer is v3's
    INIT_PRODUCER_ID: (0, 4),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    SASL_AUTHENTICATE: (0, 2),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),  # KIP-848's consumer protocol (broker/consumer_groups.py)
    CONSUMER_GROUP_DESCRIBE: (0, 1),
    **admin_apis.SUPPORTED,  # topics, configs, ACLs, records, log dirs, elections (admin_apis.py)
    **user_apis.SUPPORTED,  # SCRAM credentials and client quotas (user_apis.py)
    **txn_apis.SUPPORTED,  # the transactional producer's AddPartitionsToTxn and EndTxn (txn_apis.py)
}

# What ApiVersions advertises where it differs from what is served: Produce from v0, as Kafka 4 (KAFKA-18659).
# librdkafka before 2.8 (Debian 12's 2.0.2: kcat, rsyslog's omkafka, syslog-ng) enables gzip, snappy and lz4 only
# when the broker's Produce range includes v0-v2, and otherwise sends those batches uncompressed, with no error: a
# topic meant to be compressed stored everything at full size. Clients pick the highest version both sides have, so
# none sends v0-v2 to a broker advertising v9; one that does is closed as for any version not served.
ADVERTISED: dict[int, tuple[int, int]] = {**SUPPORTED, PRODUCE: (0, SUPPORTED[PRODUCE][1])}

# Allowed before a SASL listener's client has authenticated (KIP-152: anything else closes).
PRE_AUTH_APIS = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})

RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
# ListGroups v5's types of a group, as Kafka names them (Group.GroupType)
CONSUMER_GROUP_TYPE, CLASSIC_GROUP_TYPE = consumer_groups.CONSUMER_GROUP_TYPE, consumer_groups.CLASSIC_GROUP_TYPE
DESCRIBE_GROUPS_NOT_FOUND_VERSION = 6
_LEADER_ERRORS = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH)




def _leader(cache: Any, topic: str, partition: int) -> dict[str, int]:
    le = cache.leader_and_epoch(topic, partition)
    return {"leader_id": le.leader_id, "leader_epoch": le.leader_epoch}




class KafkaApis:
    """The handlers of one broker; ``handler(api_key)`` or None."""

    def __init__(self, broker: Any, listener: str) -> None:
        self.broker = broker  # broker.server.BrokerServer
        self.listener = listener
        # A client can fail acks=0 produces in a loop, with a client id of 32 KB: a line per 10 s at most, shortened.
        self._acks0_failures = ThrottledWarning(log, level=logging.INFO)
        self.handlers: dict[int, Handler] = {
            API_VERSIONS: self.api_versions,
            METADATA: self.metadata,
            DESCRIBE_TOPIC_PARTITIONS: self.describe_topic_partitions,
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            INIT_PRODUCER_ID: self.init_producer_id,
            FIND_COORDINATOR: self.find_coordinator,
            JOIN_GROUP: self.join_group,
            SYNC_GROUP: self.sync_group,
            HEARTBEAT: self.heartbeat,
            LEAVE_GROUP: self.leave_group,
            OFFSET_COMMIT: self.offset_commit,
            OFFSET_FETCH: self.offset_fetch,
            OFFSET_DELETE: self.offset_delete,
            DESCRIBE_GROUPS: self.describe_groups,
            LIST_GROUPS: self.list_groups,
            DELETE_GROUPS: self.delete_groups,
            CONSUMER_GROUP_HEARTBEAT: self.consumer_group_heartbeat,
            CONSUMER_GROUP_DESCRIBE: self.consumer_group_describe,
        }
        self.admin = admin_apis.AdminApis(broker, listener)
        self.handlers.update(self.admin.handlers())
        self.handlers.update(user_apis.UserApis(self.admin).handlers())
        self.txn = txn_apis.TxnApis(broker, listener)
        self.handlers.update(self.txn.handlers())
        # client address -> its turn for a large answer on the io threads (KafkaListener.io_turn); None: no turns
        self.io_turn: Callable[[str], asyncio.Lock] | None = None
        # replica.selector.class: consumers in another rack are told to read from a follower in theirs (KIP-392).
        self._rack_aware: bool | None = None  # read from the node's config at the first consumer naming a rack
        self.fetch_sessions = FetchSessions()  # consumers' incremental fetch sessions (KIP-227), on the loop only

    def close(self) -> None:
        self.admin.close()

    @property
    def service(self) -> Any:
        return self.broker.service

    @property
    def groups(self) -> Any:
        return self.broker.group_servicer

    @property
    def cache(self) -> Any:
        return self.broker.metadata_cache

    def _resp(self, req: codec.Request, values: dict[str, Any]) -> Any:
        return codec.response(req.api_key, req.api_version, values)

    # ---- ApiVersions ----
    async def api_versions(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """v3+ also lists the features (KIP-584): brook.metadata.version's levels this release supports, and the
        cluster's finalized level as of this broker's metadata (its version is the finalized features' epoch)."""
        cache = self.broker.metadata_cache
        level = cache.metadata_level
        return self._resp(req, {
            "error_code": 0, "api_keys": api_version_entries(),
            "supported_features": [{"name": features.METADATA_VERSION, "min_version": features.SUPPORTED_MIN,
                                    "max_version": features.SUPPORTED_MAX}],
            "finalized_features_epoch": cache.version,
            "finalized_features": [{"name": features.METADATA_VERSION, "max_version_level": level,
                                    "min_version_level": level}]})

    # ---- Metadata ----
    async def metadata(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """The whole answer (Brook's, KIP-430's operations, the response entities) is built on an io thread: for
        10,000 topics the entities alone took 150-290 ms of the event loop, every other client waiting. A large
        one (more than codec.LARGE_ANSWER_ITEMS topics and partitions) waits for its client address's turn there
        (``io_turn``): an address has one at a time, however many connections it sends them on."""
        topics = _get(req.body, "topics")
        # v0: an empty list means all topics; v1+: null means all, empty means none.
        all_topics = topics is None or (req.api_version == 0 and not topics)
        if not all_topics and 10 <= req.api_version < 12 and any(
                t.name is None or (t.topic_id is not None and t.topic_id.int) for t in topics):
            # As Kafka: v10-11 carry a topic id field but take names only; each topic answers INVALID_REQUEST.
            return self._resp(req, {"brokers": [], "cluster_id": None, "controller_id": -1, "topics": [
                {"error_code": ErrorCode.INVALID_REQUEST, "name": t.name, "topic_id": t.topic_id, "is_internal": False,
                 "partitions": [], "topic_authorized_operations": codec.NO_AUTHORIZED_OPERATIONS} for t in topics]})
        caller = ctx.brook_authentication.principal
        answer = functools.partial(self._metadata_answer, req, all_topics, caller)
        if self.io_turn is None or self._metadata_size(all_topics, topics) <= codec.LARGE_ANSWER_ITEMS:
            return await self.service._io(answer)
        async with self.io_turn(ctx.client_host):
            return await self.service._io(answer)

    def _metadata_size(self, all_topics: bool, topics: Any) -> int:
        """The topics and partitions a Metadata answer will hold, counted up to just past codec.LARGE_ANSWER_ITEMS
        (a named topic's partitions are looked up for at most that many names)."""
        if all_topics:
            return sum(self.cache.counts())
        count = len(topics)
        for t in topics:
            if count > codec.LARGE_ANSWER_ITEMS:
                break
            name = t if isinstance(t, str) else t.name
            info = self.cache.topic(name) if name is not None else None
            count += info.partition_count if info is not None else 0
        return count

    def _metadata_answer(self, req: codec.Request, all_topics: bool, caller: Any) -> Any:
        """The Metadata response entity (on an io thread). v12 may name topics by id (KIP-516), as librdkafka's
        consumer of the KIP-848 protocol does for the topic ids its assignment names: then, as Kafka, only the
        ids count, an unknown one is UNKNOWN_TOPIC_ID and one the caller may not describe keeps its id, without
        a name, TOPIC_AUTHORIZATION_FAILED."""
        body = req.body
        requested = [] if all_topics else list(_get(body, "topics"))
        names = [t if isinstance(t, str) else t.name for t in requested]
        names = [n for n in names if n is not None]
        ids = [] if req.api_version < 12 else list(dict.fromkeys(
            t.topic_id for t in requested if not isinstance(t, str) and t.topic_id is not None and t.topic_id.int))
        by_id: dict[str, Any] = {}  # name -> the id it was asked by
        unknown_ids: list[Any] = []
        if ids:
            for tid in ids:
                info = self.cache.topic_by_id(tid.hex)
                if info is None:
                    unknown_ids.append(tid)
                else:
                    by_id[info.name] = tid
            names = sorted(by_id)
        pb = broker_pb2.MetadataRequest(topics=names, all_topics=all_topics,
                                        allow_auto_topic_creation=not ids and bool(
                                            _get(body, "allow_auto_topic_creation", True)))
        with_topic_ops = bool(_get(body, "include_topic_authorized_operations", False))  # v8+
        with_cluster_ops = bool(_get(body, "include_cluster_authorized_operations", False))  # v8-v10
        resp, topic_ops, cluster_ops = self._metadata_and_operations(pb, caller, with_topic_ops, with_cluster_ops)
        brokers = []
        for b in resp.brokers:
            info = self.cache.broker(b.node_id)
            if b.fenced or info is None or not any(name == self.listener for name, _, _ in info.endpoints):
                continue  # Kafka lists only live brokers that have the listener the client came in on
            brokers.append({"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack or None})
        out_topics = [{"error_code": UNKNOWN_TOPIC_ID, "name": None, "topic_id": tid, "is_internal": False,
                       "topic_authorized_operations": codec.NO_AUTHORIZED_OPERATIONS, "partitions": []}
                      for tid in unknown_ids]
        for t in resp.topics:
            if t.name in by_id and t.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                # Asked by id: Kafka answers the id (not sensitive, as it says), never the name.
                out_topics.append({"error_code": t.error_code, "name": None, "topic_id": by_id[t.name],
                                   "is_internal": False, "partitions": [],
                                   "topic_authorized_operations": codec.NO_AUTHORIZED_OPERATIONS})
                continue
            out_topics.append({
                "error_code": t.error_code, "name": t.name, "topic_id": t.topic_id or None,
                "is_internal": t.is_internal,
                "topic_authorized_operations": topic_ops.get(t.name, codec.NO_AUTHORIZED_OPERATIONS),
                "partitions": [{"error_code": p.error_code, "partition_index": p.partition, "leader_id": p.leader,
                                "leader_epoch": p.leader_epoch, "replica_nodes": list(p.replicas),
                                "isr_nodes": list(p.isr), "offline_replicas": list(p.offline_replicas)}
                               for p in t.partitions]})
        return self._resp(req, {"brokers": brokers, "cluster_id": resp.cluster_id or None,
                                "controller_id": admin_apis.client_controller_id([b["node_id"] for b in brokers]),
                                "topics": out_topics, "cluster_authorized_operations": cluster_ops})

    # ---- DescribeTopicPartitions (KIP-966) ----
    async def describe_topic_partitions(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """Topics' partitions a page at a time (kafka-topics --describe and Kafka's admin from 3.8, kafka-python's
        ``describe_topic_partitions``): the Metadata answer's topics in name order, from the cursor, at most
        ``response_partition_limit`` (up to DESCRIBE_TOPIC_PARTITIONS_LIMIT) partitions, and the cursor of the
        next page. No topics named: every topic the caller may DESCRIBE. Brook has no eligible leader replicas
        (KIP-966's ELR): those fields are null. Built on an io thread, in the client address's turn when large."""
        names = sorted({t.name for t in req.body.topics})
        caller = ctx.brook_authentication.principal
        answer = functools.partial(self._describe_topic_partitions_answer, req, names, caller)
        if self.io_turn is None or self._metadata_size(not names, names) <= codec.LARGE_ANSWER_ITEMS:
            return await self.service._io(answer)
        async with self.io_turn(ctx.client_host):
            return await self.service._io(answer)

    def _describe_topic_partitions_answer(self, req: codec.Request, names: list[str], caller: Any) -> Any:
        body = req.body
        cursor = _get(body, "cursor")
        if cursor is not None and (cursor.partition_index < 0 or (names and cursor.topic_name not in names)):
            # A negative partition, or a cursor topic the request does not name: Kafka's InvalidRequestException,
            # answered on every topic (this answer has no error message).
            return self._resp(req, {"throttle_time": 0, "topics": [
                {"error_code": ErrorCode.INVALID_REQUEST, "name": n, "topic_id": None, "partitions": []}
                for n in names], "next_cursor": None})
        limit = max(1, min(int(body.response_partition_limit), DESCRIBE_TOPIC_PARTITIONS_LIMIT))
        pb = broker_pb2.MetadataRequest(topics=names, all_topics=not names, allow_auto_topic_creation=False)
        resp, topic_ops, _ = self._metadata_and_operations(pb, caller, True, False)
        topics = sorted(resp.topics, key=lambda t: t.name)
        if cursor is not None:
            topics = [t for t in topics if t.name >= cursor.topic_name]
        out: list[dict[str, Any]] = []
        next_cursor = None
        room = limit
        for i, t in enumerate(topics):
            if t.error_code:
                out.append({"error_code": t.error_code, "name": t.name, "topic_id": None, "partitions": []})
                continue
            first = cursor.partition_index if cursor is not None and t.name == cursor.topic_name else 0
            partitions = sorted((p for p in t.partitions if p.partition >= first), key=lambda p: p.partition)
            shown, rest = partitions[:room], partitions[room:]
            room -= len(shown)
            out.append({"error_code": 0, "name": t.name, "topic_id": t.topic_id or None, "is_internal": t.is_internal,
                        "topic_authorized_operations": topic_ops.get(t.name, codec.NO_AUTHORIZED_OPERATIONS),
                        "partitions": [{"error_code": p.error_code, "partition_index": p.partition,
                                        "leader_id": p.leader, "leader_epoch": p.leader_epoch,
                                        "replica_nodes": list(p.replicas), "isr_nodes": list(p.isr),
                                        "eligible_leader_replicas": None, "last_known_elr": None,
                                        "offline_replicas": list(p.offline_replicas)} for p in shown]})
            if rest:
                next_cursor = {"topic_name": t.name, "partition_index": rest[0].partition}
                break
            if room == 0 and any(not u.error_code for u in topics[i + 1:]):
                next_cursor = {"topic_name": next(u.name for u in topics[i + 1:] if not u.error_code),
                               "partition_index": 0}
                break
        return self._resp(req, {"throttle_time": 0, "topics": out, "next_cursor": next_cursor})

    def _metadata_and_operations(self, pb: broker_pb2.MetadataRequest, caller: Any, with_topic_ops: bool,
                                 with_cluster_ops: bool) -> tuple[broker_pb2.MetadataResponse, dict[str, int], int]:
        """The Metadata answer, and KIP-430's authorized operations when asked (else none): the caller's on each
        topic answered, as Kafka, unknown ones too but not those refused it (TOPIC_AUTHORIZATION_FAILED, left
        NO_AUTHORIZED_OPERATIONS), and on the cluster. On the io worker, with the answer: for 10,000 topics
        that is up to 80,000 decisions."""
        resp = self.service._metadata(pb, self.listener, caller)
        authorizer = self.service.authz
        topic_ops = {t.name: authorizer.authorized_operations(caller, authz.TOPIC, t.name) for t in resp.topics
                     if t.error_code != ErrorCode.TOPIC_AUTHORIZATION_FAILED} if with_topic_ops else {}
        cluster_ops = admin_apis.cluster_authorized_operations(authorizer, caller) if with_cluster_ops \
            else codec.NO_AUTHORIZED_OPERATIONS
        return resp, topic_ops, cluster_ops

    # ---- Produce ----
    async def produce(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        pb = broker_pb2.ProduceRequest(acks=int(body.acks), timeout_ms=_ms(body, "timeout", 30000))
        # A partition named again takes its last records, answered once, as Kafka's KafkaApis builds a map of
        # them: every copy was appended (four copies, four batches: audit).
        named: dict[tuple[str, int], bytes] = {}
        for t in body.topic_data:
            for p in t.partition_data:
                named[(t.name, p.index)] = bytes(p.records or b"")
        refused = {key: why for key, records in named.items()
                   if (why := _produce_refusal(req.api_version, records)) is not None}
        for key in refused:
            del named[key]
        for topic, index in named:
            pb.partitions.add(topic=topic, partition=index)
        # The records go to the service as they are, not copied into the message and out again.
        ctx.brook_produce_records = list(named.values())
        pb.transactional_id = _get(body, "transactional_id") or ""
        out = await self.service.Produce(pb, ctx) if pb.partitions else broker_pb2.ProduceResponse()
        for (topic, index), (code, message) in refused.items():
            out.partitions.add(topic=topic, partition=index, error_code=code, error_message=message,
                               base_offset=-1, log_append_time_ms=-1, log_start_offset=-1)
        if pb.acks == 0:
            failed = [p for p in out.partitions if p.error_code]
            if not failed:
                return None  # Kafka sends no response to acks=0
            # No answer can tell the producer, so, as Kafka does (KafkaApis.handleProduceRequest), the
            # connection is closed: the client then refreshes its metadata (a leader moved, for example).
            self._acks0_failures.warn(
                "Kafka listener: closing the connection of %s (client %s): acks=0 produce failed: %s",
                ctx.client_host, (ctx.client_id or "")[:CLIENT_ID_LOGGED_MAX],
                ", ".join(f"{p.topic[:TOPIC_LOGGED_MAX]}-{p.partition} error {p.error_code}" for p in failed[:3]))
            return False
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for p in out.partitions:
            entry: dict[str, Any] = {"index": p.partition, "error_code": p.error_code, "base_offset": p.base_offset,
                                     "log_append_time": p.log_append_time_ms, "log_start_offset": p.log_start_offset,
                                     "error_message": p.error_message or None,
                                     "record_errors": [{"batch_index": r.batch_index,
                                                        "batch_index_error_message": r.message or None}
                                                       for r in p.record_errors]}
            if p.error_code in _LEADER_ERRORS:
                entry["current_leader"] = _leader(self.cache, p.topic, p.partition)
            by_topic[p.topic].append(entry)
        return self._resp(req, {"responses": [{"name": n, "partition_responses": ps} for n, ps in by_topic.items()],
                                "throttle_time": out.throttle_time_ms})

    # ---- Fetch ----
    async def fetch(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        replica_id = _get(body, "replica_id", -1)
        if replica_id is not None and replica_id >= 0:
            # Replication runs over Brook's BROKER listener with node certificates, never here. Fetch v7+ has a
            # top-level error; before it each partition carries it (an empty answer said nothing: audit).
            code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            per = [] if req.api_version >= 7 else [{"topic": t.topic, "partitions": [{
                "partition_index": p.partition, "error_code": code, "high_watermark": -1, "last_stable_offset": -1,
                "log_start_offset": -1, "aborted_transactions": [], "records": None} for p in t.partitions]}
                for t in body.topics]
            return self._resp(req, {"error_code": code, "session_id": 0, "responses": per})
        requested = [((t.topic, p.partition), CachedPartition(p.fetch_offset, p.partition_max_bytes,
                                                              _get(p, "current_leader_epoch", -1)))
                     for t in body.topics for p in t.partitions]
        owner = (str(ctx.brook_authentication.principal), ctx.client_host)
        if req.api_version >= 7:  # KIP-227's session fields
            forgotten = [(f.topic, i) for f in _get(body, "forgotten_topics_data", ()) or () for i in f.partitions]
            plan = self.fetch_sessions.plan(int(_get(body, "session_id", 0)), int(_get(body, "session_epoch", -1)),
                                            requested, forgotten, owner)
            if plan.kind == "error":
                return self._resp(req, {"throttle_time": 0, "error_code": plan.error_code, "session_id": 0,
                                        "responses": []})
        else:
            plan = Plan("sessionless", requested)
        preferred = self._preferred_replicas(plan.fetch, _get(body, "rack_id") or "", req.api_version)
        isolation = int(_get(body, "isolation_level", 0))  # Fetch v4+
        # A consumer told to read elsewhere is answered at once, as Kafka does (no long poll for the others).
        pb = broker_pb2.FetchRequest(replica_id=-1, replica_epoch=-1,
                                     max_wait_ms=0 if preferred else _ms(body, "max_wait", 500),
                                     min_bytes=int(body.min_bytes), max_bytes=int(_get(body, "max_bytes", 0x7FFFFFFF)),
                                     follower_read=req.api_version >= 11, isolation_level=isolation)
        for (topic, partition), part in plan.fetch:
            pb.partitions.add(topic=topic, partition=partition, fetch_offset=part.fetch_offset,
                              partition_max_bytes=part.max_bytes, current_leader_epoch=part.leader_epoch,
                              last_fetched_epoch=-1, log_start_offset=-1)
        ctx.brook_file_slices = slices = {}  # the records stay in the segment files: sent with sendfile
        answer = answer_of(await self.service.Fetch(pb, ctx))
        out = answer.message
        entries: list[tuple[str, dict[str, Any]]] = []
        # What each partition returned, for a fetch with a session only: a fetch without one answers them all.
        outcomes: dict[tuple[str, int], Outcome] | None = None if plan.kind == "sessionless" else {}
        for i, p in enumerate(out.partitions):
            if req.api_version < 10 and p.error_code != ErrorCode.TOPIC_AUTHORIZATION_FAILED and self._zstd_topic(p):
                # As Kafka's fetch: a fetcher older than v10 (KIP-110) may not read zstd, so a partition whose
                # compression.type is zstd answers it this error, with no records, whatever the fetch found.
                slice_ = slices.pop((p.topic, p.partition), None)
                if slice_ is not None:
                    slice_.close()
                entries.append((p.topic, {
                    "partition_index": p.partition, "error_code": ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                    "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                    "aborted_transactions": [], "preferred_read_replica": -1, "records": None}))
                if outcomes is not None:
                    outcomes[(p.topic, p.partition)] = Outcome(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, -1, -1, False,
                                                               False)
                continue
            records = slices.pop((p.topic, p.partition), None) or answer.records_of(i)
            read_from = preferred.get((p.topic, p.partition), -1) if p.error_code == ErrorCode.NONE else -1
            if read_from >= 0:  # no records (empty, not null: as Kafka): the consumer reads from that replica
                if hasattr(records, "close"):
                    records.close()
                records = b""
            entry: dict[str, Any] = {
                "partition_index": p.partition, "error_code": p.error_code, "high_watermark": p.high_watermark,
                "last_stable_offset": p.last_stable_offset, "log_start_offset": p.log_start_offset,
                # Kafka: the list (maybe empty) for read_committed; null for read_uncommitted, errors, and a consumer
                # sent to another replica.
                "aborted_transactions": _aborted(p) if isolation == READ_COMMITTED and p.error_code == 0
                and read_from < 0 else None,
                "preferred_read_replica": read_from, "records": records}
            if p.error_code in _LEADER_ERRORS:
                entry["current_leader"] = _leader(self.cache, p.topic, p.partition)
            entries.append((p.topic, entry))
            if outcomes is not None:
                outcomes[(p.topic, p.partition)] = Outcome(p.error_code, p.high_watermark, p.log_start_offset,
                                                           bool(records), read_from >= 0)
        for leftover in slices.values():
            leftover.close()
        code, session_id, carried = (0, 0, None) if outcomes is None else \
            self.fetch_sessions.respond(plan, outcomes, owner)
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for topic, entry in entries:
            if carried is None or (topic, entry["partition_index"]) in carried:
                by_topic[topic].append(entry)
            elif hasattr(entry["records"], "close"):
                entry["records"].close()  # nothing new for an incremental session: left out of the answer
        return self._resp(req, {"throttle_time": out.throttle_time_ms, "error_code": code, "session_id": session_id,
                                "responses": [{"topic": n, "partitions": ps} for n, ps in by_topic.items()]})

    def _preferred_replicas(self, fetched: list[tuple[tuple[str, int], CachedPartition]], rack: str,
                            version: int) -> dict[tuple[str, int], int]:
        """KIP-392 with ``replica.selector.class`` = Kafka's RackAwareReplicaSelector: for each partition this
        broker leads, the replica a consumer in another rack (its ``client.rack``, Fetch v11+) should read from
        instead: an in-sync follower in the consumer's rack that has the fetch offset (the most caught up one),
        reachable on this listener. None where this broker is in the consumer's rack (the leader is preferred
        there, as by Kafka's selector) or no such follower exists."""
        if version < 11 or not rack:
            return {}
        if self._rack_aware is None:
            self._rack_aware = self.broker.settings.defaults.get("replica.selector.class", "") == RACK_AWARE_SELECTOR
        if not self._rack_aware or rack == self.broker.settings.rack:
            return {}
        rm = self.broker.replica_manager
        chosen: dict[tuple[str, int], int] = {}
        for (topic, index), asked in fetched:
            part = rm.partition(topic, index) if rm is not None else None
            if part is None or not part.is_leader:
                continue
            best: tuple[int, int, int] | None = None
            for replica in part.isr:
                info = self.cache.broker(replica)
                f = part.followers.get(replica)
                if (replica == self.broker.node_id or f is None or info is None or info.rack != rack
                        or info.fenced or info.registered_endpoint(self.listener) is None
                        or not f.log_start_offset <= asked.fetch_offset <= f.log_end_offset):
                    continue
                # Kafka's order: the largest log end offset, then the most recently caught up.
                candidate = (f.log_end_offset, f.last_caught_up_time_ms, replica)
                if best is None or candidate > best:
                    best = candidate
            if best is not None:
                chosen[(topic, index)] = best[2]
        return chosen

    def _zstd_topic(self, p: Any) -> bool:
        lg = self.broker.log_manager.get_log(p.topic, p.partition)
        return lg is not None and lg.config.compression_type == "zstd"

    # ---- ListOffsets ----
    async def list_offsets(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        size = await self._partitions_named(req.body.topics, ctx)
        pb = await self._on_io(size, functools.partial(_list_offsets_request, req.body))
        out = await self.service.ListOffsets(pb, ctx)
        return await self._on_io(len(out.partitions), lambda: self._resp(req, {"topics": codec.per_topic(
            (p.topic, {"partition_index": p.partition, "error_code": p.error_code, "timestamp": p.timestamp,
                       "offset": p.offset, "leader_epoch": p.leader_epoch}) for p in out.partitions)}))

    # ---- OffsetForLeaderEpoch ----
    async def offset_for_leader_epoch(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        size = await self._partitions_named(req.body.topics, ctx)
        pb = await self._on_io(size, functools.partial(_offsets_for_leader_epoch_request, req.body))
        out = await self.service.OffsetsForLeaderEpoch(pb, ctx)
        return await self._on_io(len(out.partitions), lambda: self._resp(req, {"topics": codec.per_topic(
            ((p.topic, {"partition": p.partition, "error_code": p.error_code, "leader_epoch": p.leader_epoch,
                        "end_offset": p.end_offset}) for p in out.partitions), "topic")}))

    async def _partitions_named(self, topics: Any, ctx: KafkaCallContext) -> int:
        """The partitions a per-partition request names, refused (the connection closed, as the service would)
        when more than the cluster's bound before any is converted."""
        size = sum(len(t.partitions) for t in topics)
        await refuse_oversized(ctx, self.cache, size, "partitions")
        return size

    async def _on_io(self, size: int, build: Callable[[], Any]) -> Any:
        """``build()``: a per-partition request's protobuf, or its answer entity. Of more than
        codec.LARGE_ANSWER_ITEMS partitions, made on the io pool in its client address's turn, not on the event
        loop: a request may name twice the cluster's partitions, and a ListOffsets answer of 10,000 took 45 ms
        of the loop (100,000: 0.7 s, with 80 ms more to convert the request)."""
        if size <= codec.LARGE_ANSWER_ITEMS:
            return build()
        return await self.service._io(build)

    # ---- InitProducerId ----
    async def init_producer_id(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        if _get(body, "transactional_id") is not None:
            return self._resp(req, await self.txn.init_producer_id(req, ctx))
        out = await self.service.InitProducerId(broker_pb2.InitProducerIdRequest(
            producer_id=_get(body, "producer_id", -1), producer_epoch=_get(body, "producer_epoch", -1)), ctx)
        return self._resp(req, {"error_code": out.error_code, "producer_id": out.producer_id,
                                "producer_epoch": out.producer_epoch})

    # ---- group coordinator ----
    async def find_coordinator(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        key_type = _get(body, "key_type", 0)
        keys = list(_get(body, "coordinator_keys", None) or ()) if req.api_version >= 4 else [body.key]
        # As many keys as DeleteGroups may name groups, each looked up once and every copy answered alike: 9,000
        # keys made 9,000 calls on the group pool in turn, 5.7 s (audit).
        await self.groups.refuse_too_many_groups(len(keys), ctx)
        found = []
        answered: dict[str, dict[str, Any]] = {}
        for key in keys:
            if key in answered:
                found.append(answered[key])
                continue
            if key_type == 1:  # a transaction coordinator (txn_apis.py)
                found.append(await self.txn.find_coordinator(key, ctx))
                answered[key] = found[-1]
                continue
            if key_type != 0:  # Kafka's share groups (key type 2, KIP-932): none here
                found.append({"key": key, "error_code": ErrorCode.INVALID_REQUEST, "node_id": -1, "host": "",
                              "port": -1, "error_message": f"unknown coordinator key type {key_type}"})
                continue
            out = await self.groups.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id=key), ctx)
            found.append({"key": key, "error_code": out.error_code, "error_message": out.error_message or None,
                          "node_id": out.node_id, "host": out.host, "port": out.port if out.error_code == 0 else -1})
            answered[key] = found[-1]
        if req.api_version >= 4:
            return self._resp(req, {"coordinators": found})
        return self._resp(req, found[0])

    async def join_group(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        # Held until the join phase ends, as Kafka holds it (the group's rebalance timeout bounds it): a member
        # waiting for a dead one's session to expire (45 s by default) was answered REBALANCE_IN_PROGRESS at the
        # listener's request timeout (30 s), which librdkafka reports to the application as an error (audit).
        ctx.clear_deadline()
        body = req.body
        session_ms = _ms(body, "session_timeout", 10000)
        pb = group_pb2.JoinGroupRequest(
            group_id=body.group_id, session_timeout_ms=session_ms,
            rebalance_timeout_ms=_ms(body, "rebalance_timeout", session_ms), member_id=body.member_id,
            protocol_type=body.protocol_type, client_id=ctx.client_id or "", client_host=ctx.client_host,
            reason=_get(body, "reason") or "", group_instance_id=_get(body, "group_instance_id") or "",
            protocols=[group_pb2.GroupProtocol(name=p.name, metadata=bytes(p.metadata)) for p in body.protocols])
        # A leader's long answer keeps the members' metadata apart, as the coordinator holds it: sent as it is.
        answer = join_answer_of(await self.groups.JoinGroup(pb, ctx))
        if answer.message.error_code == ErrorCode.MEMBER_ID_REQUIRED and req.api_version < 4:
            # Before KIP-394 (v4) a client cannot join twice: the coordinator's id is used at once.
            pb.member_id = answer.message.member_id
            answer = join_answer_of(await self.groups.JoinGroup(pb, ctx))
        out = answer.message
        return self._resp(req, {
            "error_code": out.error_code, "generation_id": out.generation_id,
            "protocol_type": body.protocol_type if out.error_code == 0 else None,
            "protocol_name": out.protocol_name or (None if req.api_version >= 7 else ""),
            "leader": out.leader, "member_id": out.member_id,
            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id or None,
                         "metadata": answer.value_of(i)} for i, m in enumerate(out.members)]})

    async def sync_group(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        ctx.clear_deadline()  # held until the leader's assignment comes, as join_group's wait
        body = req.body
        pb = group_pb2.SyncGroupRequest(
            group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
            protocol_type=_get(body, "protocol_type") or "", protocol_name=_get(body, "protocol_name") or "",
            group_instance_id=_get(body, "group_instance_id") or "",
            assignments=[group_pb2.SyncGroupAssignment(member_id=a.member_id, assignment=bytes(a.assignment))
                         for a in body.assignments])
        out = await self.groups.SyncGroup(pb, ctx)
        return self._resp(req, {"error_code": out.error_code, "protocol_type": _get(body, "protocol_type"),
                                "protocol_name": out.protocol_name or None, "assignment": out.assignment})

    async def heartbeat(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        out = await self.groups.Heartbeat(group_pb2.HeartbeatRequest(
            group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
            group_instance_id=_get(body, "group_instance_id") or ""), ctx)
        return self._resp(req, {"error_code": out.error_code})

    async def leave_group(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        # v3+ (KIP-345) names members by id and instance id, several at once (static members removed by an admin)
        members = [(m.member_id, _get(m, "group_instance_id") or "") for m in body.members] \
            if req.api_version >= 3 else [(body.member_id, "")]
        reasons = [_get(m, "reason") for m in body.members] if req.api_version >= 3 else []
        out = await self.groups.LeaveGroup(group_pb2.LeaveGroupRequest(
            group_id=body.group_id, reason=next((r for r in reasons if r), ""),
            members=[group_pb2.LeaveGroupMember(member_id=m, group_instance_id=gi) for m, gi in members]), ctx)
        codes = [m.error_code for m in out.members] if len(out.members) == len(members) \
            else [out.error_code] * len(members)
        top = out.error_code if req.api_version >= 3 else (out.error_code or codes[0])  # v0-2: one member, no list
        return self._resp(req, {"error_code": top,
                                "members": [{"member_id": m, "group_instance_id": gi or None, "error_code": c}
                                            for (m, gi), c in zip(members, codes, strict=True)]})

    async def offset_commit(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        size = await self._partitions_named(req.body.topics, ctx)
        pb = await self._group_answer(size, functools.partial(_offset_commit_request, req.body))
        out = await self.groups.OffsetCommit(pb, ctx)
        return await self._group_answer(size, functools.partial(self._offset_commit_answer, req, out))

    def _offset_commit_answer(self, req: codec.Request, out: group_pb2.OffsetCommitResponse) -> Any:
        codes = {(e.topic, e.partition): e.error_code for e in out.partitions}
        return self._resp(req, {"topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index,
                 "error_code": codes.get((t.name, p.partition_index), out.error_code)} for p in t.partitions]}
            for t in req.body.topics]})

    async def offset_fetch(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        if req.api_version >= 8:
            return await self._offset_fetch_groups(req, ctx)
        body = req.body
        topics = _get(body, "topics")
        # The partitions are bounded and the group's ACL checked before they are expanded: an 8 MB frame of
        # 2M partition indexes was made 2M protobuf entries on the event loop before either (audit).
        await refuse_oversized(ctx, self.cache, sum(len(t.partition_indexes) for t in topics or ()), "partitions")
        out = await self._offset_fetch_one(ctx, body.group_id, topics,
                                           require_stable=bool(_get(body, "require_stable", False)))
        return await self._group_answer(len(out.partitions), functools.partial(self._offset_fetch_answer, req, out))

    async def _offset_fetch_groups(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """OffsetFetch v8 (KIP-709): several groups in one request, each answered as its own request would be (a
        client sends each coordinator the groups it coordinates; any other group is NOT_COORDINATOR). kafka-python
        resets a group's offsets through it; at v7 its request for named partitions failed in its own encoder."""
        groups = list(req.body.groups)
        await refuse_oversized(ctx, self.cache, sum(len(t.partition_indexes) for g in groups
                                                    for t in _get(g, "topics") or ()), "partitions")
        # As many groups as DeleteGroups may name: max(1000, twice the groups this coordinator holds).
        await self.groups.refuse_too_many_groups(len(groups), ctx)
        # Each group once: a copy of an id named before is INVALID_REQUEST (Kafka's clients key their groups by
        # id). Each copy was fetched under the coordinator's lock and answered in full: 1,000 copies of a group
        # holding 4 MB of offsets made a 10 KB request build 4 GB (audit).
        answers: list[tuple[str, Any]] = []
        seen: set[str] = set()
        for g in groups:
            repeated = g.group_id in seen
            seen.add(g.group_id)
            answers.append((g.group_id, None if repeated else
                            await self._offset_fetch_one(ctx, g.group_id, _get(g, "topics"), _get(g, "member_id"),
                                                         _get(g, "member_epoch", -1),
                                                         bool(_get(req.body, "require_stable", False)))))
        return await self._group_answer(sum(len(out.partitions) for _, out in answers if out is not None),
                                        lambda: self._resp(req, {"groups": [
            {"group_id": group_id, "error_code": ErrorCode.INVALID_REQUEST, "topics": []} if out is None else
            {"group_id": group_id, "error_code": out.error_code, "topics": _offset_fetch_topics(out)}
            for group_id, out in answers]}))

    async def _offset_fetch_one(self, ctx: KafkaCallContext, group_id: str, topics: Any, member_id: str | None = None,
                                member_epoch: int = -1, require_stable: bool = False) -> Any:
        """The coordinator's answer for one group's committed offsets (``topics`` None: every partition), or its
        refusal without DESCRIBE on the group, or (v9) for a member of Kafka's consumer protocol not at its epoch.
        ``require_stable`` (v7+, what read_committed consumers ask): a partition with offsets of a transaction not
        ended yet is UNSTABLE_OFFSET_COMMIT, which the client retries, as Kafka answers."""
        refused = self.groups._refused(ctx, authz.DESCRIBE, group_id, group_pb2.OffsetFetchResponse)
        if refused is not None:
            return refused
        if member_id is not None or member_epoch >= 0:
            try:
                await self.groups.run_on_pool(functools.partial(self.groups.c.validate_offset_fetch, group_id,
                                                                member_id, member_epoch))
            except consumer_groups.HeartbeatError as exc:
                return group_pb2.OffsetFetchResponse(error_code=exc.code)
        pb = group_pb2.OffsetFetchRequest(group_id=group_id)
        for t in topics or ():
            for p in t.partition_indexes:
                pb.partitions.add(topic=t.name, partition=p)
        out = await self.groups.OffsetFetch(pb, ctx)
        if require_stable and out.error_code == ErrorCode.NONE and out.partitions:
            unstable = self.groups.c.unstable_offsets(group_id)
            for p in out.partitions:
                if TopicPartition(p.topic, p.partition) in unstable:
                    p.error_code, p.offset, p.metadata = ErrorCode.UNSTABLE_OFFSET_COMMIT, -1, ""
        return out

    def _offset_fetch_answer(self, req: codec.Request, out: Any) -> Any:
        extra: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if out.error_code != 0 and req.api_version < 2:
            # v0/v1 have no top-level error: each asked partition carries it.
            for t in _get(req.body, "topics") or ():
                extra[t.name] += [{"partition_index": p, "committed_offset": -1, "metadata": "",
                                   "error_code": out.error_code} for p in t.partition_indexes]
        return self._resp(req, {"error_code": out.error_code, "topics": _offset_fetch_topics(out, extra)})

    async def _group_answer(self, size: int, build: Callable[[], Any]) -> Any:
        """``build()``: a group call's answer entity, made from the coordinator's answer (or a large OffsetCommit's
        or OffsetDelete's request, converted for it). Of more than
        codec.LARGE_ANSWER_ITEMS elements, it is made on the group pool, in its client address's turn, not on
        the event loop: a ListGroups of 500 groups took ~3 ms of the loop, and a flood of them delayed every
        request of the broker (the profile of a flood from one address: 40% of the loop building them)."""
        if size <= codec.LARGE_ANSWER_ITEMS:
            return build()
        return await self.groups.run_on_pool(build)

    async def offset_delete(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        size = await self._partitions_named(req.body.topics, ctx)
        pb = await self._group_answer(size, functools.partial(_offset_delete_request, req.body))
        out = await self.groups.OffsetDelete(pb, ctx)
        return await self._group_answer(size, functools.partial(self._offset_delete_answer, req, out))

    def _offset_delete_answer(self, req: codec.Request, out: group_pb2.OffsetDeleteResponse) -> Any:
        codes = {(e.topic, e.partition): e.error_code for e in out.partitions}
        return self._resp(req, {"error_code": out.error_code, "topics": [
            {"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                             "error_code": codes.get((t.name, p.partition_index), 0)}
                                            for p in t.partitions]} for t in req.body.topics]})

    async def describe_groups(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        out = await self.groups.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=list(req.body.groups)), ctx)
        ops: dict[str, int] = {}
        # KIP-430 (v3+): as Kafka, the caller's operations on each group described without error (refused
        # ones stay NO_AUTHORIZED_OPERATIONS); each distinct group once, on the io worker (up to 1,000s of them).
        if _get(req.body, "include_authorized_operations", False) and any(g.error_code == 0 for g in out.groups):
            described = {g.group_id for g in out.groups if g.error_code == 0}
            caller, authorizer = ctx.brook_authentication.principal, self.groups.authz
            ops = await self.service._io(
                lambda: {gid: authorizer.authorized_operations(caller, authz.GROUP, gid) for gid in described})
        size = len(out.groups) + sum(len(g.members) for g in out.groups)
        return await self._group_answer(size, functools.partial(self._describe_groups_answer, req, out, ops))

    def _describe_groups_answer(self, req: codec.Request, out: Any, ops: dict[str, int]) -> Any:
        for g in out.groups:
            if g.group_type == CONSUMER_GROUP_TYPE:
                # Not a classic group: Kafka's DescribeGroups answers it as Dead (GROUP_ID_NOT_FOUND at v6); its
                # tools describe it with ConsumerGroupDescribe.
                group_id = g.group_id
                g.Clear()
                g.group_id, g.state = group_id, GroupState.DEAD.value
                if req.api_version >= DESCRIBE_GROUPS_NOT_FOUND_VERSION:
                    g.error_code, g.error_message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a classic group."
        if req.api_version >= DESCRIBE_GROUPS_NOT_FOUND_VERSION:
            _not_found_groups(out)
        return self._resp(req, {"groups": [
            {"error_code": g.error_code, "error_message": g.error_message or None, "group_id": g.group_id,
             "group_state": g.state,
             "protocol_type": g.protocol_type, "protocol_data": g.protocol_name,
             "authorized_operations": ops.get(g.group_id, codec.NO_AUTHORIZED_OPERATIONS) if g.error_code == 0
             else codec.NO_AUTHORIZED_OPERATIONS,
             "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id or None,
                          "client_id": m.client_id,
                          "client_host": _kafka_host(m.client_host), "member_metadata": m.metadata,
                          "member_assignment": m.assignment} for m in g.members]}
            for g in out.groups]})

    async def list_groups(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        states = list(_get(req.body, "states_filter", ()) or ())
        types = {t.lower() for t in _get(req.body, "types_filter", ()) or ()}
        if types and not types & {CLASSIC_GROUP_TYPE, CONSUMER_GROUP_TYPE}:
            return self._resp(req, {"error_code": 0, "groups": []})  # no share or streams groups here
        out = await self.groups.ListGroups(group_pb2.ListGroupsRequest(states=states), ctx)
        listed = [g for g in out.groups if not types or (g.group_type or CLASSIC_GROUP_TYPE) in types]
        return await self._group_answer(len(listed), lambda: self._resp(req, {
            "error_code": out.error_code,
            "groups": [{"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state,
                        "group_type": g.group_type or CLASSIC_GROUP_TYPE} for g in listed]}))

    async def consumer_group_describe(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """ConsumerGroupDescribe (KIP-848): the consumer-protocol groups as Kafka 4's tools describe them."""
        groups = await self.groups.consumer_group_describe(
            list(req.body.group_ids), bool(_get(req.body, "include_authorized_operations", False)), ctx)
        size = len(groups) + sum(len(m["assignment"]["topic_partitions"]) + len(m["target_assignment"]["topic_partitions"])
                                 for g in groups for m in g.get("members", ()))
        return await self._group_answer(size, lambda: self._resp(req, {"throttle_time": 0, "groups": [
            {"group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
             "authorized_operations": codec.NO_AUTHORIZED_OPERATIONS, **g,
             "members": [{**m, "client_host": _kafka_host(m["client_host"])} for m in g.get("members", ())]}
            for g in groups]}))

    async def consumer_group_heartbeat(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """ConsumerGroupHeartbeat (KIP-848): the consumer protocol's only request (broker/consumer_groups.py)."""
        body = req.body
        owned = _get(body, "topic_partitions")
        if owned is not None:
            await refuse_oversized(ctx, self.cache, sum(len(t.partitions) for t in owned), "partitions")
        hb = consumer_groups.Heartbeat(
            group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch,
            instance_id=body.instance_id, rack_id=body.rack_id,
            rebalance_timeout_ms=_ms(body, "rebalance_timeout", -1),
            subscribed_topic_names=None if body.subscribed_topic_names is None else list(body.subscribed_topic_names),
            subscribed_topic_regex=_get(body, "subscribed_topic_regex"), server_assignor=body.server_assignor,
            owned=None if owned is None else [(t.topic_id, tuple(t.partitions)) for t in owned],
            client_id=ctx.client_id or "", client_host=ctx.client_host)
        out = await self.groups.consumer_group_heartbeat(hb, ctx)
        if isinstance(out, errors.BrookError | consumer_groups.HeartbeatError):
            return self._resp(req, {"throttle_time": 0, "error_code": out.code, "error_message": out.message,
                                    "member_epoch": 0, "heartbeat_interval": 0})
        assignment = None if out.assignment is None else {
            "topic_partitions": consumer_groups.describe_assignment(out.assignment)}
        return self._resp(req, {"throttle_time": 0, "error_code": 0, "member_id": out.member_id,
                                "member_epoch": out.member_epoch, "heartbeat_interval": out.heartbeat_interval_ms,
                                "assignment": assignment})

    async def delete_groups(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        out = await self.groups.DeleteGroups(group_pb2.DeleteGroupsRequest(group_ids=list(req.body.groups_names)),
                                             ctx)
        return self._resp(req, {"results": [{"group_id": r.group_id, "error_code": r.error_code}
                                            for r in out.results]})


def _not_found_groups(out: group_pb2.DescribeGroupsResponse) -> None:
    """DescribeGroups v6 (KIP-1043), as Kafka answers it: a group the coordinator does not hold (described as
    Dead, with nothing in it) is GROUP_ID_NOT_FOUND, "Group <id> not found."; before v6 it stays a Dead group
    without an error, which clients read as not found."""
    for g in out.groups:
        if g.error_code == 0 and g.state == GroupState.DEAD.value:
            g.error_code = ErrorCode.GROUP_ID_NOT_FOUND
            g.error_message = f"Group {g.group_id} not found."


def _kafka_host(host: str) -> str:
    """A member's address as Kafka's coordinator shows it (Java's ``InetAddress.toString()`` of an address without a
    host name: ``/127.0.0.1``), which kafka-consumer-groups.sh prints and tools parse; Brook keeps the bare address
    (its CLI and gRPC API show that)."""
    return f"/{host}" if host and not host.startswith("/") else host


def api_version_entries() -> list[dict[str, int]]:
    return [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(ADVERTISED.items())]


def _produce_refusal(version: int, records: bytes) -> tuple[int, str] | None:
    """As Kafka's ProduceRequest.validateRecords, a partition's records refused before the append (error code,
    message): zstd (KIP-110) before Produce v7, which an older client could not read, and more than one record
    batch (v3 and later hold exactly one; a zstd batch after a first one got past the codec check). None when the
    append decides (records with no readable batch header are refused there)."""
    try:
        header = read_header(records)
    except errors.CorruptMessageError:
        return None
    if version < 7 and header.compression == CODEC_ZSTD:
        return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"Produce v{version} may not use zstd compression (v7 and later)"
    if len(records) > header.size:
        return ErrorCode.INVALID_RECORD, (f"Produce v{version} may hold exactly one record batch per partition; "
                                          f"these records hold {len(records) - header.size} bytes after the first")
    return None


def _offset_fetch_topics(out: Any, extra: dict[str, list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """The topics of an OffsetFetch answer, from the coordinator's, followed by ``extra`` partitions per topic."""
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in out.partitions:
        by_topic[c.topic].append({"partition_index": c.partition, "committed_offset": c.offset,
                                  "committed_leader_epoch": c.leader_epoch, "metadata": c.metadata,
                                  "error_code": c.error_code})
    for name, partitions in (extra or {}).items():
        by_topic[name] += partitions
    return [{"name": n, "partitions": ps} for n, ps in by_topic.items()]


def _aborted(p: broker_pb2.FetchPartitionResponse) -> list[dict[str, int]]:
    """A read_committed answer's aborted transactions, as Fetch v4+ carries them."""
    return [{"producer_id": a.producer_id, "first_offset": a.first_offset} for a in p.aborted_transactions]


# ---- per-partition requests as the services take them (on the io or group pool when large: Apis._on_io) ----
def _list_offsets_request(body: Any) -> broker_pb2.ListOffsetsRequest:
    pb = broker_pb2.ListOffsetsRequest(replica_id=-1, isolation_level=int(_get(body, "isolation_level", 0)))  # v2+
    for t in body.topics:
        for p in t.partitions:
            pb.partitions.add(topic=t.name, partition=p.partition_index, timestamp=p.timestamp,
                              current_leader_epoch=_get(p, "current_leader_epoch", -1))
    return pb


def _offsets_for_leader_epoch_request(body: Any) -> broker_pb2.OffsetsForLeaderEpochRequest:
    pb = broker_pb2.OffsetsForLeaderEpochRequest(replica_id=-1)
    for t in body.topics:
        for p in t.partitions:
            pb.partitions.add(topic=t.topic, partition=p.partition, leader_epoch=p.leader_epoch,
                              current_leader_epoch=_get(p, "current_leader_epoch", -1))
    return pb


def _offset_commit_request(body: Any) -> group_pb2.OffsetCommitRequest:
    generation = _get(body, "generation_id_or_member_epoch", _get(body, "generation_id", -1))
    pb = group_pb2.OffsetCommitRequest(group_id=body.group_id, generation_id=generation, member_id=body.member_id,
                                       group_instance_id=_get(body, "group_instance_id") or "")
    retention_ms = _ms(body, "retention_time", -1)  # v2-v4 only; -1: the broker's retention
    if retention_ms >= 0:
        pb.retention_time_ms = retention_ms
    for t in body.topics:
        for p in t.partitions:
            pb.partitions.add(topic=t.name, partition=p.partition_index, offset=p.committed_offset,
                              leader_epoch=_get(p, "committed_leader_epoch", -1), metadata=p.committed_metadata or "")
    return pb


def _offset_delete_request(body: Any) -> group_pb2.OffsetDeleteRequest:
    pb = group_pb2.OffsetDeleteRequest(group_id=body.group_id)
    for t in body.topics:
        for p in t.partitions:
            pb.partitions.add(topic=t.name, partition=p.partition_index)
    return pb
