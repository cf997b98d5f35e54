"""Kafka admin APIs on the Kafka listener: topics, partitions, configs, ACLs, records, log dirs, elections.

As for the data APIs (apis.py), every handler translates the Kafka request into the
protobuf request of the Brook RPC that already serves gRPC admin clients, and the answer
back; no rule is implemented here.

- Controller writes and reads (CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs,
  DescribeConfigs of topics, ElectLeaders, partition reassignments, ACLs) go to the active
  controller through the broker's ControllerClient, carrying the Kafka client's principal
  in ``x-brook-forwarded-principal`` (broker/principal.py): the controller authorizes the
  client, never the broker (a super user), as Kafka's forwarding (KIP-590) does, and counts
  its partition mutations against its controller mutation quota (KIP-599; versions older
  than ``STRICT_QUOTA_SINCE`` are only throttled). A request the controller refuses as a
  whole (``BrookError``) answers every item with that code.
- DeleteRecords and DescribeLogDirs are the broker's own RPCs (BrokerService).
- DescribeCluster, like Kafka's, is answered from this broker's metadata (the same path as
  Metadata), with the brokers' addresses on the listener the client came in on.
- DescribeConfigs of a BROKER resource is answered by that broker from its own node config
  overlaid with the dynamic cluster configs it has applied (as a Kafka broker does), after
  DESCRIBE_CONFIGS on the cluster: each key's source (dynamic default, static, default), synonyms
  and read-only flag as Kafka's (``_own_configs``); secrets are never shown (``is_sensitive``, null value).

What one request may cost is bounded before anything is forwarded (an audit found 50 KB requests that
stalled the event loop for seconds): DescribeConfigs and (Incremental)AlterConfigs name at most
``MAX_RESOURCES_PER_REQUEST`` resources, each once (every copy of a duplicate is INVALID_REQUEST, as
Kafka's (Incremental)AlterConfigs answer); DeleteAcls holds at most ``MAX_ACL_FILTERS`` filters, forwards
each distinct one once and lists each deleted binding once, under the first filter matching it (Kafka
lists it under each); large answers are built on the admin pool (``_answer``).

IncrementalAlterConfigs' APPEND and SUBTRACT change a LIST-typed key (``cleanup.policy``, the cluster's
``log.cleanup.policy``) as Kafka's controller does: from the current value read from the active controller
(``_resolve_list_ops``), sent as the SET of the value they make.

Where Brook has no equivalent the answer says so rather than approximating (SCRAM credentials and client quotas:
user_apis.py): per-broker
dynamic configs, ACL hosts that are not ``*`` or an IP
address, and resource types other than TOPIC/GROUP/CLUSTER are INVALID_REQUEST; DeleteTopics stops
before topic ids (v6).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from broker import authorizer as authz
from broker import loggers
from broker import principal as principals
from broker.admission import refuse_oversized
from broker.kafka_wire import codec
from broker.kafka_wire.codec import get as _get
from broker.kafka_wire.codec import get_ms as _ms
from broker.kafka_wire.context import Handler, KafkaCallContext
from broker.quotas import CONTROLLER_MUTATION
from metadata_quorum import cluster_configs, features
from metadata_quorum import security as sec
from metadata_quorum.client import SecurityControllerClient
from metadata_quorum.security_service import MAX_ITEMS_PER_REQUEST, acl_filter_key, acl_matches_filter
from metadata_quorum.state import validate_topic_name
from proto import broker_pb2, errors, security_pb2
from proto import controller_pb2 as cpb
from proto.errors import ErrorCode
from storage import log_config

log = logging.getLogger(__name__)

CREATE_TOPICS, DELETE_RECORDS, DELETE_TOPICS = 19, 21, 20
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
DESCRIBE_CONFIGS, ALTER_CONFIGS, DESCRIBE_LOG_DIRS, CREATE_PARTITIONS = 32, 33, 35, 37
ELECT_LEADERS, INCREMENTAL_ALTER_CONFIGS = 43, 44
ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS, DESCRIBE_CLUSTER = 45, 46, 60
UPDATE_FEATURES, DESCRIBE_QUORUM, DESCRIBE_PRODUCERS = 57, 55, 61
LIST_CONFIG_RESOURCES = 74
METADATA_TOPIC = "__cluster_metadata"  # the partition Kafka's DescribeQuorum describes (partition 0)

# api key -> (min, max) version served. Floors: the oldest kio has a schema for. Ceilings: DeleteTopics
# stops before v6 (topics by id, which Brook's controller does not take); the rest are Kafka 4's newest.
SUPPORTED: dict[int, tuple[int, int]] = {
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 5),
    DELETE_RECORDS: (0, 2),
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    DESCRIBE_CONFIGS: (1, 4),
    ALTER_CONFIGS: (0, 2),
    DESCRIBE_LOG_DIRS: (1, 4),
    CREATE_PARTITIONS: (0, 3),
    ELECT_LEADERS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    LIST_PARTITION_REASSIGNMENTS: (0, 0),
    DESCRIBE_CLUSTER: (0, 2),
    UPDATE_FEATURES: (0, 1),  # v2 answers without per-feature results
    DESCRIBE_QUORUM: (0, 2),
    DESCRIBE_PRODUCERS: (0, 0),
    LIST_CONFIG_RESOURCES: (0, 1),  # v0 was KIP-714's ListClientMetricsResources; v1 (KIP-1142) every type
}

# KIP-599: the first versions whose clients know THROTTLING_QUOTA_EXCEEDED. Older ones are forwarded with
# permissive_quota: the controller accepts their topics over the controller mutation quota and only sets
# throttle_time_ms (Kafka's PermissiveControllerMutationQuota).
STRICT_QUOTA_SINCE = {CREATE_TOPICS: 6, DELETE_TOPICS: 5, CREATE_PARTITIONS: 3}

# Kafka's ConfigResource.Type, ConfigEntry.ConfigSource and AlterConfigOp.OpType codes.
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER = 2, 4, 8
RESOURCE_CLIENT_METRICS, RESOURCE_GROUP = 16, 32
SOURCE_DYNAMIC_TOPIC, SOURCE_DYNAMIC_DEFAULT_BROKER, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 3, 4, 5
SOURCE_DYNAMIC_BROKER_LOGGER = 6
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {0: "SET", 1: "DELETE", 2: "APPEND", 3: "SUBTRACT"}

# Kafka's ACL enums (ResourceType, PatternType, AclOperation, AclPermissionType) <-> Brook's names.
_ANY, _MATCH = 1, 2
RESOURCE_TYPES = {2: "TOPIC", 3: "GROUP", 4: "CLUSTER", 5: "TRANSACTIONAL_ID", 6: "DELEGATION_TOKEN", 7: "USER"}
PATTERN_TYPES = {3: "LITERAL", 4: "PREFIXED"}
OPERATIONS = {2: "ALL", **{code: name for name, code in authz.OPERATION_CODES.items()}}
PERMISSIONS = {2: "DENY", 3: "ALLOW"}
_CODE_OF = {kind: {name: code for code, name in table.items()}
            for kind, table in (("resource", RESOURCE_TYPES), ("pattern", PATTERN_TYPES),
                                ("operation", OPERATIONS), ("permission", PERMISSIONS))}

# Node-config keys whose values are secrets: described with a null value and is_sensitive (as Kafka's PASSWORD type).
_SENSITIVE = re.compile(r"password|secret|jaas|credential|token|bootstrap\.users|\.key$|private", re.IGNORECASE)
UNSUPPORTED_ENDPOINT_TYPE = 115  # Kafka's; not among Brook's own codes
_DEFAULT_TIMEOUT_S = 30.0
MAX_FEATURE_UPDATES = 16  # UpdateFeatures items forwarded (Brook has one feature)
# Config resources one DescribeConfigs / (Incremental)AlterConfigs may name: the controller's limit on the topics
# of one request (metadata_quorum.controller.MAX_TOPICS_PER_REQUEST), which BROKER resources count towards too.
MAX_RESOURCES_PER_REQUEST = 1000
# Filters one DeleteAcls may hold: the controller's limit on a security request's items (CreateAcls' too).
MAX_ACL_FILTERS = MAX_ITEMS_PER_REQUEST
# What Kafka answers each copy of a config resource a request names more than once (ConfigAdminManager).
DUPLICATE_RESOURCE = "Each resource must appear at most once."

# Answers of more items than this are built on the admin pool, not the event loop (AdminApis._answer).
_ANSWER_ON_LOOP_MAX_ITEMS = 100
# The config resource types ListConfigResources v1 lists (Kafka's ListConfigResourcesRequest.supportedResourceTypes).
LISTED_CONFIG_TYPES = frozenset({RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS,
                                 RESOURCE_GROUP})
# A config entry as described: (name, value, source, is_sensitive, documentation, read_only, synonyms), a synonym
# being (name, value, source): each source that has a value for the entry, the one in effect first.
_Synonym = tuple[str, str | None, int]
_ConfigRow = tuple[str, str | None, int, bool, str, bool, tuple[_Synonym, ...]]



def _is_sensitive(key: str) -> bool:
    """A secret: a ``password`` key of the node config (its declared type), or a name that looks like one."""
    from broker.config import KEYS

    d = KEYS.get(key)
    return (d is not None and d.kind == "password") or bool(_SENSITIVE.search(key))


# Kafka's ConfigEntry.ConfigType (KIP-569), which DescribeConfigs v3+ gives each entry, by the kind a
# key is declared with (storage/log_config.py for topics, broker/config.py for brokers).
CONFIG_TYPES = {"bool": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7, "password": 9}
CONFIG_TYPE_UNKNOWN = 0


def config_type(resource_type: int, name: str) -> int:
    """The ConfigType of ``name`` in a TOPIC or BROKER resource (UNKNOWN for a name Brook does not declare)."""
    from broker.config import KEYS

    d: Any = log_config.TOPIC_CONFIGS.get(name) if resource_type == RESOURCE_TOPIC else KEYS.get(name)
    if d is not None and d.kind == "topic":  # a cluster default of a topic config (log.retention.ms)
        d = log_config.TOPIC_CONFIGS.get(d.topic_key)
    return CONFIG_TYPES.get(d.kind, CONFIG_TYPE_UNKNOWN) if d is not None else CONFIG_TYPE_UNKNOWN


class _Failed(Exception):
    """A request refused as a whole: every item of the response carries ``code``/``message``."""

    def __init__(self, code: int, message: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _MatchesNothing(_Failed):
    """An ACL filter no binding can match: answered with no error and nothing found."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.NONE, None)


ADMIN_WORKERS = 4


class AdminApis:
    """The admin handlers of one Kafka listener (``handlers()``: api key -> handler)."""

    def __init__(self, broker: Any, listener: str) -> None:
        self.broker = broker  # broker.server.BrokerServer
        self.listener = listener
        self._security_client: SecurityControllerClient | None = None
        # Forwarded admin calls wait on the controller (up to a topic creation's timeout): a pool of their own,
        # so an admin burst never takes the io threads produce and fetch need.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=ADMIN_WORKERS,
                                                           thread_name_prefix=f"kafka-admin-{listener}")

    def handlers(self) -> dict[int, Handler]:
        return {
            CREATE_TOPICS: self.create_topics,
            DELETE_TOPICS: self.delete_topics,
            CREATE_PARTITIONS: self.create_partitions,
            DESCRIBE_CONFIGS: self.describe_configs,
            ALTER_CONFIGS: self.alter_configs,
            INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            DESCRIBE_CLUSTER: self.describe_cluster,
            DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            DELETE_RECORDS: self.delete_records,
            DESCRIBE_ACLS: self.describe_acls,
            CREATE_ACLS: self.create_acls,
            DELETE_ACLS: self.delete_acls,
            ELECT_LEADERS: self.elect_leaders,
            ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
            UPDATE_FEATURES: self.update_features,
            DESCRIBE_QUORUM: self.describe_quorum,
            DESCRIBE_PRODUCERS: self.describe_producers,
            LIST_CONFIG_RESOURCES: self.list_config_resources,
        }

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._security_client is not None:
            self._security_client.close()
            self._security_client = None

    @property
    def service(self) -> Any:
        return self.broker.service

    def _resp(self, req: codec.Request, values: dict[str, Any]) -> Any:
        return codec.response(req.api_key, req.api_version, values)

    # ---- the controller, as the Kafka client ----
    async def _controller(self, ctx: KafkaCallContext, method: str, request: Any, *, security: bool = False,
                          timeout_ms: int = 0, as_broker: bool = False) -> Any:
        """``method`` on the active controller with the client's principal forwarded (``as_broker``: as this broker,
        for a read it needs to answer a request it has authorized itself); ``_Failed`` when the controller refuses
        the whole request (or none answers in time)."""
        caller = ctx.brook_authentication.principal
        metadata = None if as_broker else (
            (principals.FORWARDED_PRINCIPAL_KEY, str(caller)), (principals.FORWARDED_HOST_KEY, caller.host))
        quotas = getattr(getattr(self.broker, "security", None), "quotas", None) \
            if getattr(request, "permissive_quota", False) else None
        if quotas is not None and (left_s := quotas.held_s(caller, (CONTROLLER_MUTATION,))) > 0:
            # An older client's mutation is accepted over the quota and only told throttle_time_ms (KIP-599's
            # permissive quota); Kafka then mutes its connection for that long. One that asks again before the
            # time is over waits it out here (its connection reads nothing meanwhile), so a client that ignores
            # throttle_time_ms is held to the quota: before, it created partitions as fast as it liked.
            quotas.held_total += 1
            await asyncio.sleep(left_s)
        budget_s = budget_left_s(ctx, method)
        if timeout_ms > 0:
            budget_s = min(budget_s, timeout_ms / 1000 + 1.0)  # the controller answers within timeout_ms
        client = self._security() if security else self.broker.controller_client
        try:
            out = await asyncio.get_running_loop().run_in_executor(
                self._pool, lambda: client.call(method, request, timeout_s=max(0.5, budget_s), metadata=metadata))
        except errors.BrookError as exc:
            raise _Failed(exc.code, exc.message) from None
        if quotas is not None:
            quotas.hold(caller, CONTROLLER_MUTATION, out.throttle_time_ms)
        return out

    async def _answer(self, build: Callable[[], Any], *, heavy: bool) -> Any:
        """``build()``, a response; on the admin pool when ``heavy`` (up to 1,000 topics' configs, thousands of
        deleted ACLs, thousands of refused items), not to hold the event loop every other connection is served
        on. (A large answer is then encoded on a worker thread, as every one: server.ENCODE_ON_LOOP_MAX_ITEMS.)"""
        if not heavy:
            return build()
        return await asyncio.get_running_loop().run_in_executor(self._pool, build)

    def _security(self) -> SecurityControllerClient:
        if self._security_client is None:
            s = self.broker.settings
            self._security_client = SecurityControllerClient(list(s.controller_endpoints), timeout_s=10,
                                                             security=s.controller_security)
        return self._security_client

    # ---- CreateTopics ----
    async def create_topics(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        timeout_ms = _ms(body, "timeout", 60000)
        validate_only = bool(_get(body, "validate_only", False))
        pb = cpb.CreateTopicsRequest(validate_only=validate_only, timeout_ms=timeout_ms,
                                     permissive_quota=_permissive(req))
        refused: dict[str, tuple[int, str]] = {}
        throttle_ms = 0
        for t in body.topics:
            try:
                pb.topics.append(_creatable_topic(t))
            except _Failed as exc:
                refused[t.name] = (exc.code, exc.message)
        results: dict[str, dict[str, Any]] = {}
        if pb.topics:
            try:
                out = await self._controller(ctx, "CreateTopics", pb, timeout_ms=timeout_ms)
                throttle_ms = out.throttle_time_ms
                for r in out.results:
                    ok = r.error_code == 0
                    results[r.name] = {"name": r.name, "topic_id": r.topic_id or None, "error_code": r.error_code,
                                       "error_message": r.error_message or None,
                                       "num_partitions": r.num_partitions if ok else -1,
                                       "replication_factor": r.replication_factor if ok else -1}
            except _Failed as exc:
                refused.update({t.name: (exc.code, exc.message) for t in pb.topics})
        for name, (code, message) in refused.items():
            results[name] = {"name": name, "error_code": code, "error_message": message, "num_partitions": -1,
                             "replication_factor": -1}
        # KIP-525 (v5+): the created topic's configs, about 25 a topic, when the client may describe them. Made and
        # answered off the loop past a few topics: 1,000 topics with validate_only (nothing created, so repeatable)
        # held it 190 ms (audit).
        heavy = len(results) > _ANSWER_ON_LOOP_MAX_ITEMS
        if req.api_version >= 5:
            await self._add_created_configs(ctx, pb, results, heavy=heavy)
        ordered = [results[name] for name in dict.fromkeys(t.name for t in body.topics) if name in results]
        return await self._answer(lambda: self._resp(req, {"topics": ordered, "throttle_time": throttle_ms}),
                                  heavy=heavy)

    async def _add_created_configs(self, ctx: KafkaCallContext, pb: cpb.CreateTopicsRequest,
                                   results: dict[str, dict[str, Any]], *, heavy: bool) -> None:
        created = [n for n, r in results.items() if r["error_code"] == 0]
        for name in results:
            results[name]["configs"] = None if name not in created else []
        if not created:
            return
        topic_defaults = _topic_defaults(self._node_view()[1])
        if pb.validate_only:
            # Nothing exists to describe: every config the topic would have, as Kafka's controller lists them
            # (its own values, then what this broker's defaults give the others); only the overrides were listed.
            asked = {t.name: t.configs for t in pb.topics}

            def would_have() -> None:
                for name in created:
                    results[name]["configs"] = [_topic_config_entry(
                        (key, asked[name][key], SOURCE_DYNAMIC_TOPIC, False, "", False, ()) if key in asked[name]
                        else (key, d.default, SOURCE_DEFAULT, False, "", False, ()), topic_defaults.get(key))
                        for key, d in log_config.TOPIC_CONFIGS.items()]
            await self._answer(would_have, heavy=heavy)
            return
        try:
            out = await self._controller(ctx, "DescribeConfigs", cpb.DescribeConfigsRequest(topics=created))
        except _Failed as exc:
            for name in created:
                results[name]["topic_config_error_code"] = exc.code
            return

        def described() -> None:
            for r in out.results:
                if r.topic not in results:
                    continue
                if r.error_code:
                    results[r.topic]["topic_config_error_code"] = r.error_code
                    continue
                results[r.topic]["configs"] = [_topic_config_entry(_topic_row(e), topic_defaults.get(e.name))
                                               for e in r.entries]
        await self._answer(described, heavy=heavy)

    # ---- DeleteTopics ----
    async def delete_topics(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        names = [n for n in _get(req.body, "topic_names", ()) or () if n is not None]
        timeout_ms = _ms(req.body, "timeout", 30000)
        throttle_ms = 0
        try:
            out = await self._controller(ctx, "DeleteTopics", cpb.DeleteTopicsRequest(
                names=names, timeout_ms=timeout_ms, permissive_quota=_permissive(req)), timeout_ms=timeout_ms)
            throttle_ms = out.throttle_time_ms
            responses = [{"name": r.name, "error_code": r.error_code, "error_message": r.error_message or None}
                         for r in out.results]
        except _Failed as exc:
            responses = [{"name": n, "error_code": exc.code, "error_message": exc.message} for n in names]
        return self._resp(req, {"responses": _once_per_name(responses), "throttle_time": throttle_ms})

    # ---- CreatePartitions ----
    async def create_partitions(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        timeout_ms = _ms(body, "timeout", 30000)
        pb = cpb.CreatePartitionsRequest(validate_only=bool(body.validate_only), timeout_ms=timeout_ms,
                                         permissive_quota=_permissive(req))
        for t in body.topics:
            pb.topics.add(name=t.name, count=t.count, assignments=[
                cpb.ReplicaList(replicas=list(a.broker_ids)) for a in t.assignments or ()])
        throttle_ms = 0
        try:
            out = await self._controller(ctx, "CreatePartitions", pb, timeout_ms=timeout_ms)
            throttle_ms = out.throttle_time_ms
            results = [{"name": r.name, "error_code": r.error_code, "error_message": r.error_message or None}
                       for r in out.results]
        except _Failed as exc:
            results = [{"name": t.name, "error_code": exc.code, "error_message": exc.message} for t in body.topics]
        return self._resp(req, {"results": _once_per_name(results), "throttle_time": throttle_ms})

    # ---- DescribeConfigs ----
    async def describe_configs(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """At most MAX_RESOURCES_PER_REQUEST resources (see ``_screened``), each copy of one answered as Kafka
        does, but each distinct topic asked of the controller once and the node's configs (BROKER resources)
        read and authorized once a request, and the answer built off the loop: 9,999 copies of one topic or
        broker were each expanded again, with documentation and synonyms, on the event loop (an audit: a 50 KB
        request stalled it 4 s, or 17 s and 778 MB for a broker resource)."""
        body = req.body
        resources = list(body.resources)
        screened = _screened(resources, refuse_duplicates=False)
        topics = list(dict.fromkeys(r.resource_name for r, refused in zip(resources, screened, strict=True)
                                    if refused is None and r.resource_type == RESOURCE_TOPIC))
        described = await self._describe_topics(ctx, topics)
        node: tuple[list[_ConfigRow], list[_ConfigRow]] | _Failed | None = None  # what BROKER resources show
        view: tuple[list[_ConfigRow], list[_ConfigRow]] | None = None  # read once: topics show it too
        if any(refused is None and r.resource_type == RESOURCE_BROKER
               for r, refused in zip(resources, screened, strict=True)):
            try:
                node = view = self._node_configs(ctx)
            except _Failed as exc:
                node = exc
        if isinstance(described, dict) and described and view is None:
            view = self._node_view()
        if any(refused is None and r.resource_type == RESOURCE_BROKER_LOGGER
               for r, refused in zip(resources, screened, strict=True)):
            try:
                self._authorize_cluster(ctx, authz.DESCRIBE_CONFIGS)
                node_loggers: list[tuple[str, str]] | _Failed = loggers.describe()
            except _Failed as exc:
                node_loggers = exc
        else:
            node_loggers = []
        # Off the loop too for more than one node resource: each lists every node config key (about 130), with its
        # documentation and synonyms, and 100 copies of one took 127 ms of the loop (audit).
        nodes = sum(r.resource_type in (RESOURCE_BROKER, RESOURCE_BROKER_LOGGER) for r in resources)
        return await self._answer(functools.partial(
            self._describe_answer, req, resources, screened, described, node, view, node_loggers),
            heavy=isinstance(described, dict) and bool(described) or len(resources) > _ANSWER_ON_LOOP_MAX_ITEMS
            or nodes > 1)

    async def _describe_topics(self, ctx: KafkaCallContext, topics: list[str]) -> dict[str, Any] | _Failed:
        """The controller's description of each of ``topics`` (each once), by name; _Failed if it refused them all."""
        if not topics:
            return {}
        try:
            out = await self._controller(ctx, "DescribeConfigs", cpb.DescribeConfigsRequest(topics=topics))
        except _Failed as exc:
            return exc
        return {r.topic: r for r in out.results}

    def _authorize_cluster(self, ctx: KafkaCallContext, operation: str) -> None:
        who = ctx.brook_authentication.principal
        if not self.broker.authorizer.authorize(who, operation, authz.CLUSTER):
            exc = authz.denied_error(who, operation, authz.CLUSTER)
            raise _Failed(exc.code, exc.message)

    def _own_logger_resource(self, name: str) -> None:
        if name != str(self.broker.node_id):
            raise _Failed(ErrorCode.INVALID_REQUEST, f"broker {self.broker.node_id} has its own loggers (resource "
                                                     f"name '{self.broker.node_id}'), not broker '{name}'s")

    def _describe_answer(self, req: codec.Request, resources: list[Any], screened: list[_Failed | None],
                         described: dict[str, Any] | _Failed,
                         node: tuple[list[_ConfigRow], list[_ConfigRow]] | _Failed | None,
                         view: tuple[list[_ConfigRow], list[_ConfigRow]] | None = None,
                         node_loggers: list[tuple[str, str]] | _Failed = ()) -> Any:  # type: ignore[assignment]
        """The DescribeConfigs response (on the admin pool: up to 1,000 topics' entries with documentation)."""
        body = req.body
        with_docs = bool(_get(body, "include_documentation", False))
        with_synonyms = bool(_get(body, "include_synonyms", False))
        results = []
        topic_defaults: dict[str, _ConfigRow] | None = None  # read once, for the first topic described
        for res, refused in zip(resources, screened, strict=True):
            keys = _get(res, "configuration_keys")
            wanted = None if keys is None else set(keys)
            entry: dict[str, Any] = {"resource_type": res.resource_type, "resource_name": res.resource_name,
                                     "error_code": 0, "error_message": None, "configs": []}
            try:
                if refused is not None:
                    raise refused
                if res.resource_type == RESOURCE_TOPIC:
                    r = _described(described, res.resource_name)
                    if topic_defaults is None:
                        topic_defaults = _topic_defaults(view[1] if view is not None else self._node_view()[1])
                    configs = [_with_broker_synonyms(_topic_row(e), topic_defaults.get(e.name)) for e in r.entries]
                elif res.resource_type == RESOURCE_BROKER:
                    assert node is not None
                    configs = self._broker_configs(node, res.resource_name)
                elif res.resource_type == RESOURCE_BROKER_LOGGER:
                    if isinstance(node_loggers, _Failed):
                        raise node_loggers
                    self._own_logger_resource(res.resource_name)
                    configs = [(name, level, SOURCE_DYNAMIC_BROKER_LOGGER, False, None, False, ())
                               for name, level in node_loggers]
                else:
                    raise _Failed(ErrorCode.INVALID_REQUEST, f"Brook describes TOPIC, BROKER and BROKER_LOGGER "
                                                             f"configs, not resource type {res.resource_type}")
            except _Failed as exc:
                entry.update(error_code=exc.code, error_message=exc.message)
                results.append(entry)
                continue
            for name, value, source, sensitive, doc, read_only, synonyms in configs:
                if wanted is not None and name not in wanted:
                    continue
                entry["configs"].append({
                    "name": name, "value": None if sensitive else value, "read_only": read_only,
                    "config_type": config_type(res.resource_type, name),
                    "config_source": source, "is_sensitive": sensitive,
                    "documentation": (doc or None) if with_docs else None,
                    "synonyms": [{"name": n, "value": None if sensitive else v, "source": src}
                                 for n, v, src in synonyms] if with_synonyms else []})
            results.append(entry)
        return self._resp(req, {"results": results, "throttle_time": 0})

    def _node_configs(self, ctx: KafkaCallContext) -> tuple[list[_ConfigRow], list[_ConfigRow]]:
        """What BROKER resources describe, after DESCRIBE_CONFIGS on the cluster: the dynamic cluster-wide
        defaults (resource name ''), and this broker's own configs (``_own_configs``)."""
        self._authorize_cluster(ctx, authz.DESCRIBE_CONFIGS)
        return self._node_view()

    def _node_view(self) -> tuple[list[_ConfigRow], list[_ConfigRow]]:
        """(the dynamic cluster-wide defaults, this broker's own configs), as BROKER resources show them."""
        reconfigurable = frozenset(cluster_configs.known_keys())
        dynamic = {k: v for k, v in self.broker.metadata_cache.cluster_configs().items() if k in reconfigurable}
        # As Kafka's '' resource: only the dynamic defaults, each its own only synonym.
        defaults: list[_ConfigRow] = [
            (k, v, SOURCE_DYNAMIC_DEFAULT_BROKER, _is_sensitive(k), cluster_configs.doc(k), False,
             ((k, v, SOURCE_DYNAMIC_DEFAULT_BROKER),)) for k, v in sorted(dynamic.items())]
        return defaults, self._own_configs(dynamic, reconfigurable)

    def _own_configs(self, dynamic: dict[str, str], reconfigurable: frozenset[str]) -> list[_ConfigRow]:
        """This broker's configs as a Kafka broker describes its own: every key of its node config (those of its
        roles) and every dynamic cluster config, each with the value in effect and where that comes from: a
        dynamic cluster-wide default (DYNAMIC_DEFAULT_BROKER_CONFIG) over the node's file, environment or flags
        (STATIC_BROKER_CONFIG) over the built-in default (DEFAULT_CONFIG, also what a key no one set shows).
        Synonyms: each of those with a value, in that order; a coarser-unit key the operator wrote
        (log.retention.hours) is the static synonym of the key it stands for (log.retention.ms), and is
        listed itself. Read-only unless Brook can change the key at runtime (a dynamic cluster config), as
        Kafka's DynamicBrokerConfig. Brook has no per-broker dynamic configs (DYNAMIC_BROKER_CONFIG).

        The topic defaults (log.retention.ms, log.segment.bytes, message.max.bytes, min.insync.replicas, ...)
        show what this broker's logs use: the dynamic value, else the node's, else storage/log_config.py's.
        Settings made without a node config (``broker.config.NodeDefaults``: an embedder's own dict) show
        what they hold as static, the topic defaults and the dynamic configs."""
        from broker.config import COARSE_UNITS, KEYS

        settings = self.broker.settings.defaults
        node = getattr(settings, "node", None)
        if node is not None:
            given: frozenset[str] = node.set_by_operator
            roles = set(node.roles)
            names = {k for k, d in KEYS.items() if roles.intersection(d.roles)}
            static: Callable[[str], str | None] = node.text
        else:
            own = {"node.id": str(self.broker.node_id), **{k: str(v) for k, v in settings.items()}}
            given = frozenset(own)
            # Not the topic configs' own names (segment.bytes): only their broker keys (log.segment.bytes).
            names = {k for k in own if k in KEYS or k not in log_config.TOPIC_CONFIGS}
            names.update(k for k, d in KEYS.items() if d.topic_key is not None)
            static = own.get
        names.update(reconfigurable)
        coarse_of: dict[str, list[str]] = defaultdict(list)
        for coarse, (fine, _) in COARSE_UNITS.items():
            coarse_of[fine].append(coarse)
        rows: list[_ConfigRow] = []
        for name in sorted(names):
            d = KEYS.get(name)
            synonyms: list[_Synonym] = []
            if name in dynamic:
                synonyms.append((name, dynamic[name], SOURCE_DYNAMIC_DEFAULT_BROKER))
            for key in (name, *coarse_of.get(name, ())):
                text = static(key) if key in given else None
                if text is not None:
                    synonyms.append((key, text, SOURCE_STATIC_BROKER))
            default = _builtin_default(name)
            if default is not None:
                synonyms.append((name, default, SOURCE_DEFAULT))
            value, source = (synonyms[0][1], synonyms[0][2]) if synonyms else (None, SOURCE_DEFAULT)
            if source == SOURCE_STATIC_BROKER and synonyms[0][0] != name:
                value = static(name) or value  # set in a coarser unit: the value it stands for, as applied
            doc = d.doc if d is not None else cluster_configs.doc(name) if name in reconfigurable else ""
            sensitive = _is_sensitive(name)
            if sensitive:  # a secret's value is never even held for the answer
                value, synonyms = None, [(n, None, src) for n, _, src in synonyms]
            rows.append((name, value, source, sensitive, doc, name not in reconfigurable, tuple(synonyms)))
        return rows

    def _broker_configs(self, node: tuple[list[_ConfigRow], list[_ConfigRow]] | _Failed,
                        name: str) -> list[_ConfigRow]:
        """A BROKER resource as a Kafka broker answers it: "" = the dynamic cluster-wide defaults, this broker's
        id = its own configs (dynamic, static and default); another broker's id is refused."""
        if isinstance(node, _Failed):
            raise node
        defaults, own = node
        if name == "":
            return defaults
        if name != str(self.broker.node_id):
            raise _Failed(ErrorCode.INVALID_REQUEST,
                          f"broker {self.broker.node_id} describes its own configs (resource name "
                          f"'{self.broker.node_id}') or the cluster defaults (''), not broker '{name}'")
        return own

    # ---- AlterConfigs / IncrementalAlterConfigs ----
    async def alter_configs(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """Kafka's legacy AlterConfigs replaces a resource's whole dynamic config: keys not given are reset."""
        resources = list(req.body.resources)
        plans = []
        for res, refused in zip(resources, _screened(resources), strict=True):
            given = {c.name: c.value for c in res.configs} if refused is None else {}
            try:
                if refused is not None:
                    raise refused
                if res.resource_type == RESOURCE_BROKER_LOGGER:  # as Kafka's brokers answer it
                    raise _Failed(ErrorCode.INVALID_REQUEST, "AlterConfigs does not support the resource type "
                                                             "BROKER_LOGGER: use IncrementalAlterConfigs")
                if any(v is None for v in given.values()):
                    raise _Failed(ErrorCode.INVALID_CONFIG, "a null config value (use IncrementalAlterConfigs DELETE)")
                every = log_config.TOPIC_CONFIGS if res.resource_type == RESOURCE_TOPIC \
                    else cluster_configs.known_keys()
                plans.append((res, given, [k for k in every if k not in given], None))
            except _Failed as exc:
                plans.append((res, {}, [], exc))
        return await self._alter(req, ctx, plans)

    async def incremental_alter_configs(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        resources = list(req.body.resources)
        plans: list[tuple[Any, dict[str, str], list[str], _Failed | None]] = []
        list_ops: list[tuple[int, dict[str, tuple[int, str]]]] = []  # (plan index, {key: (APPEND/SUBTRACT, value)})
        for res, refused in zip(resources, _screened(resources), strict=True):
            to_set: dict[str, str] = {}
            to_delete: list[str] = []
            ops: dict[str, tuple[int, str]] = {}
            if refused is None:
                refused = _incremental_ops(res, to_set, to_delete, ops)
            if refused is None and ops:
                list_ops.append((len(plans), ops))
            plans.append((res, to_set, to_delete, refused))
        if list_ops and self.broker.metadata_cache.metadata_level >= features.CONTROLLER_LIST_OPS:
            # Every controller makes them atomically (ListOp): sent as they came.
            return await self._alter(req, ctx, plans, dict(list_ops))
        if list_ops:
            await self._resolve_list_ops(ctx, plans, list_ops)
        return await self._alter(req, ctx, plans)

    async def _resolve_list_ops(self, ctx: KafkaCallContext,
                                plans: list[tuple[Any, dict[str, str], list[str], _Failed | None]],
                                list_ops: list[tuple[int, dict[str, tuple[int, str]]]]) -> None:
        """APPEND and SUBTRACT as SETs of the values they make, as Kafka's controller computes them: from the
        resource's own (dynamic) value, else the key's built-in default, never the cluster default a topic
        inherits. The values are read from the active controller (a read barrier, so a change it has answered is
        seen), not from this broker's metadata, which may not have it yet. Two admins changing one list key at
        once can each miss the other's change, as with Kafka's ZooKeeper-era brokers, which also read, changed
        and wrote the value: below brook.metadata.version 3 only. From it the controller does all three, one
        request at a time, as KRaft's does on its one thread."""
        topics = list(dict.fromkeys(plans[i][0].resource_name for i, _ in list_ops
                                    if plans[i][0].resource_type == RESOURCE_TOPIC))
        described = await self._describe_topics(ctx, topics)
        cluster: dict[str, str] | _Failed = {}
        if any(plans[i][0].resource_type == RESOURCE_BROKER for i, _ in list_ops):
            try:
                out = await self._controller(ctx, "DescribeClusterConfigs", cpb.DescribeClusterConfigsRequest())
                cluster = {e.name: e.value for e in out.entries if e.source == "dynamic"}
            except _Failed as exc:
                cluster = exc
        for i, ops in list_ops:
            res, to_set, to_delete, _ = plans[i]
            try:
                if res.resource_type == RESOURCE_TOPIC:
                    r = _described(described, res.resource_name, altering=True)
                    own = {e.name: e.value for e in r.entries if not e.is_default}
                else:
                    if isinstance(cluster, _Failed):
                        raise cluster
                    own = cluster
                for name, (op, value) in ops.items():
                    to_set[name] = log_config.list_value(own.get(name), _list_key(res.resource_type, name).default,
                                                         op == OP_SUBTRACT, value)
            except _Failed as exc:
                plans[i] = (res, to_set, to_delete, exc)

    async def _alter(self, req: codec.Request, ctx: KafkaCallContext,
                     plans: list[tuple[Any, dict[str, str], list[str], _Failed | None]],
                     list_ops: dict[int, dict[str, tuple[int, str]]] | None = None) -> Any:
        """Every resource in one controller call at most per kind: the TOPIC resources in one AlterConfigs, the
        BROKER resource '' (named once at most: ``_screened``) in one AlterClusterConfigs. Each copy of a BROKER
        '' resource used to be its own controller call, one after the other (an audit: a 40 KB request made
        9,999 of them, refused or not)."""
        validate_only = bool(req.body.validate_only)
        outcome: list[tuple[int, str] | None] = [None] * len(plans)
        topic_plans: list[tuple[int, str, dict[str, str], list[str]]] = []
        cluster_plan: tuple[int, dict[str, str], list[str]] | None = None
        for i, (res, to_set, to_delete, refused) in enumerate(plans):
            if refused is not None:
                outcome[i] = (refused.code, refused.message)
            elif res.resource_type == RESOURCE_TOPIC:
                topic_plans.append((i, res.resource_name, to_set, to_delete))
            elif res.resource_type == RESOURCE_BROKER and res.resource_name == "":
                cluster_plan = (i, to_set, to_delete)
            elif res.resource_type == RESOURCE_BROKER:
                try:  # the caller's right first, as Kafka checks it: a refusal then says what the caller may not do
                    self._authorize_cluster(ctx, authz.ALTER_CONFIGS)
                    outcome[i] = (ErrorCode.INVALID_REQUEST,
                                  "Brook has no per-broker dynamic configs: alter the cluster-wide default "
                                  "(BROKER resource name '') or the node's config file")
                except _Failed as exc:
                    outcome[i] = (exc.code, exc.message)
            elif res.resource_type == RESOURCE_BROKER_LOGGER:
                try:
                    self._authorize_cluster(ctx, authz.ALTER_CONFIGS)
                    self._own_logger_resource(res.resource_name)
                    try:
                        loggers.check(to_set, to_delete)
                    except errors.BrookError as exc:
                        raise _Failed(exc.code, exc.message) from None
                    if not validate_only:
                        loggers.apply(to_set, to_delete)
                    outcome[i] = (0, "")
                except _Failed as exc:
                    outcome[i] = (exc.code, exc.message)
            else:
                outcome[i] = (ErrorCode.INVALID_REQUEST, f"Brook alters TOPIC, BROKER and BROKER_LOGGER configs, "
                                                         f"not resource type {res.resource_type}")
        if cluster_plan is not None:
            i, to_set, to_delete = cluster_plan
            try:  # Kafka's dynamic default broker configs are Brook's cluster configs
                await self._controller(ctx, "AlterClusterConfigs", cpb.AlterClusterConfigsRequest(
                    set=to_set, delete=to_delete, validate_only=validate_only, list_ops=_list_op_messages(
                        (list_ops or {}).get(i, {}))))
                outcome[i] = (0, "")
            except _Failed as exc:
                outcome[i] = (exc.code, exc.message)
        if topic_plans:
            pb = cpb.AlterConfigsRequest(validate_only=validate_only, resources=[
                cpb.AlterConfigsResource(topic=name, set=to_set, delete=to_delete,
                                         list_ops=_list_op_messages((list_ops or {}).get(i, {})))
                for i, name, to_set, to_delete in topic_plans])
            try:
                out = await self._controller(ctx, "AlterConfigs", pb)
                by_name = {r.name: _topic_error(r.name, r.error_code, r.error_message, altering=True)
                           for r in out.results}
                for i, name, _, _ in topic_plans:
                    outcome[i] = by_name.get(name)
            except _Failed as exc:
                for i, _, _, _ in topic_plans:
                    outcome[i] = (exc.code, exc.message)

        def answer() -> Any:
            responses = []
            for (res, *_), done in zip(plans, outcome, strict=True):
                code, message = done if done is not None else (ErrorCode.UNKNOWN_SERVER_ERROR, "no result")
                responses.append({"resource_type": res.resource_type, "resource_name": res.resource_name,
                                  "error_code": code, "error_message": message or None})
            return self._resp(req, {"responses": responses, "throttle_time": 0})
        return await self._answer(answer, heavy=len(plans) > _ANSWER_ON_LOOP_MAX_ITEMS)

    # ---- DescribeCluster ----
    async def describe_cluster(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        if _get(req.body, "endpoint_type", 1) != 1:
            return self._resp(req, {"error_code": UNSUPPORTED_ENDPOINT_TYPE,
                                    "error_message": "brokers describe the brokers (endpoint type 1); Brook's "
                                                     "controllers speak gRPC only", "endpoint_type": 1})
        include_fenced = bool(_get(req.body, "include_fenced_brokers", False))
        pb = broker_pb2.MetadataRequest(topics=[], all_topics=False, allow_auto_topic_creation=False)
        caller = ctx.brook_authentication.principal
        resp = await self.service._io(lambda: self.service._metadata(pb, self.listener, caller))
        brokers = []
        for b in resp.brokers:
            info = self.broker.metadata_cache.broker(b.node_id)
            if info is None or not any(name == self.listener for name, _, _ in info.endpoints):
                continue
            if b.fenced and not include_fenced:
                continue
            brokers.append({"broker_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack or None,
                            "is_fenced": b.fenced})
        ops = cluster_authorized_operations(self.service.authz, caller) \
            if _get(req.body, "include_cluster_authorized_operations", False) else codec.NO_AUTHORIZED_OPERATIONS
        return self._resp(req, {"error_code": 0, "cluster_id": resp.cluster_id, "endpoint_type": 1,
                                "controller_id": client_controller_id(
                                    [b["broker_id"] for b in brokers if not b["is_fenced"]]),
                                "brokers": brokers, "cluster_authorized_operations": ops})

    # ---- DescribeQuorum (KIP-595; v1: KIP-836's timestamps; v2: KIP-853) ----
    async def describe_quorum(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """The metadata quorum as ``kafka-metadata-quorum describe --status/--replication`` and kafka-python's
        ``describe_metadata_quorum`` show it, after DESCRIBE on the cluster (Kafka's rule): the quorum as the active
        controller sees it. Brook's metadata log is a Raft log of commands, not a Kafka partition: the offsets are its
        entry indexes (high watermark: the commit index) and the leader epoch is the Raft term. Brokers follow the
        metadata through a watch stream, not by fetching the log, so there are no observers; v2's ``nodes`` is empty,
        as Brook's controllers speak gRPC only (DescribeCluster answers the same). With no active controller, the
        partition is NOT_LEADER_OR_FOLLOWER, naming the voter whose view it is."""
        def answer(code: int, message: str | None, topics: list[dict[str, Any]]) -> Any:
            return self._resp(req, {"error_code": code, "error_message": message, "topics": topics, "nodes": []})
        requested = sum(len(t.partitions) for t in req.body.topics)
        await refuse_oversized(ctx, self.broker.metadata_cache, requested, "partitions")
        try:
            self._authorize_cluster(ctx, authz.DESCRIBE)
            budget_s = max(0.5, budget_left_s(ctx, "DescribeQuorum"))
            client = self.broker.controller_client
            q = await asyncio.get_running_loop().run_in_executor(
                self._pool, lambda: client.describe_quorum(timeout_s=budget_s))
        except (_Failed, errors.BrookError) as exc:
            return answer(exc.code, exc.message, [])
        now_ms = int(time.time() * 1000)
        voters = []
        for v in q.voters:
            seen_ms = now_ms - v.last_contact_ms_ago if v.last_contact_ms_ago >= 0 else -1
            voters.append({"replica_id": v.node_id, "replica_directory_id": None, "log_end_offset": v.log_end_index,
                           "last_fetch_timestamp": seen_ms, "last_caught_up_timestamp": seen_ms})

        def build() -> Any:
            # The quorum is one partition: it is answered once (a copy of it is INVALID_REQUEST). A request naming it
            # thousands of times was answered in full each time, with its voters, on the event loop (10,000: 149 ms;
            # audit).
            topics = []
            answered = False
            for t in req.body.topics:
                partitions = []
                for p in t.partitions:
                    if str(t.topic_name) == METADATA_TOPIC and int(p.partition_index) == 0:
                        if answered:
                            partitions.append({"partition_index": 0, "error_code": ErrorCode.INVALID_REQUEST,
                                               "error_message": f"{METADATA_TOPIC} 0 is named more than once"})
                            continue
                        answered = True
                    if str(t.topic_name) != METADATA_TOPIC or int(p.partition_index) != 0:
                        partitions.append({"partition_index": p.partition_index,
                                           "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                           "error_message": f"the metadata quorum is {METADATA_TOPIC} partition 0"})
                    elif not q.responder_is_active:
                        partitions.append({"partition_index": 0, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                           "error_message": f"no active controller: voter {q.responder_id} answered, "
                                                            f"at term {q.term}", "leader_id": -1})
                    else:
                        partitions.append({"partition_index": 0, "error_code": 0, "error_message": None,
                                           "leader_id": q.leader_id, "leader_epoch": q.term,
                                           "high_watermark": q.commit_index, "current_voters": voters,
                                           "observers": []})
                topics.append({"topic_name": t.topic_name, "partitions": partitions})
            return answer(0, None, topics)
        return await self._answer(build, heavy=requested > _ANSWER_ON_LOOP_MAX_ITEMS)

    # ---- UpdateFeatures (KIP-584) ----
    async def update_features(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """Raise brook.metadata.version (metadata_quorum/features.py) through the controller, which checks ALTER on
        the cluster and that every node supports the level. A downgrade, or deleting the feature, is refused
        INVALID_UPDATE_VERSION: a finalized level is never lowered (Kafka refuses most metadata.version downgrades
        too)."""
        updates = list(req.body.feature_updates)
        validate_only = bool(_get(req.body, "validate_only", False))
        results: list[dict[str, Any]] = []
        seen: set[str] = set()
        for u in updates[:MAX_FEATURE_UPDATES]:
            name, level = str(u.feature), int(u.max_version_level)
            downgrade = bool(_get(u, "allow_downgrade", False)) or int(_get(u, "upgrade_type", 1)) != 1
            try:
                if name in seen:
                    raise _Failed(ErrorCode.INVALID_REQUEST, f"feature {name!r} is named more than once")
                seen.add(name)
                if downgrade or level < features.SUPPORTED_MIN:
                    raise _Failed(ErrorCode.INVALID_UPDATE_VERSION,
                                  f"{name} cannot be lowered or deleted: what a higher level let the controller "
                                  f"write stays in the metadata")
                await self._controller(ctx, "UpdateFeatures", cpb.UpdateFeaturesRequest(
                    name=name, level=level, validate_only=validate_only))
                results.append({"feature": name, "error_code": 0, "error_message": None})
            except _Failed as exc:
                results.append({"feature": name, "error_code": exc.code, "error_message": exc.message})
        results += [{"feature": str(u.feature), "error_code": ErrorCode.INVALID_REQUEST,
                     "error_message": f"at most {MAX_FEATURE_UPDATES} feature updates in one request"}
                    for u in updates[MAX_FEATURE_UPDATES:]]
        return self._resp(req, {"throttle_time": 0, "error_code": 0, "error_message": None, "results": results})

    # ---- DescribeLogDirs (this broker's) ----
    async def describe_log_dirs(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        asked = _get(req.body, "topics")  # null: every partition; else these partitions only
        if asked is not None:
            # Its partitions are bounded as any request's, before they are expanded: an 8 MB frame of 2M
            # partition indexes was made a set of 2M pairs on the event loop before the service's checks (audit).
            await refuse_oversized(ctx, self.broker.metadata_cache, sum(len(t.partitions) for t in asked),
                                   "partitions")
        topics = sorted({t.topic for t in asked}) if asked else []
        if asked is not None and not topics:
            topics = ["\x00none"]  # an empty list asks for no partition (Brook's empty list means all)
        out = await self.service.DescribeLogDirs(broker_pb2.DescribeLogDirsRequest(topics=topics), ctx)
        if out.error_code:
            # v0-v2 have no top-level error: the client sees no log dir, as from Kafka.
            return self._resp(req, {"error_code": out.error_code, "results": [], "throttle_time": 0})
        def build() -> Any:
            # Only now (DESCRIBE on the cluster checked, the topics bounded) the partitions asked for.
            wanted = None if asked is None else {(t.topic, p) for t in asked for p in t.partitions}
            results = []
            for d in out.dirs:
                by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
                for p in d.partitions:
                    if wanted is not None and (p.topic, p.partition) not in wanted:
                        continue
                    by_topic[p.topic].append({"partition_index": p.partition, "partition_size": p.size_bytes,
                                              "offset_lag": p.offset_lag, "is_future_key": False})
                results.append({"error_code": d.error_code, "log_dir": d.path, "total_bytes": d.total_bytes,
                                "usable_bytes": d.usable_bytes,
                                "topics": [{"name": n, "partitions": ps} for n, ps in sorted(by_topic.items())]})
            return self._resp(req, {"error_code": 0, "results": results, "throttle_time": out.throttle_time_ms})

        # Every partition of the broker (null topics) was built on the event loop: 86 ms for 20,000 (audit).
        return await self._answer(build, heavy=sum(len(d.partitions) for d in out.dirs) > _ANSWER_ON_LOOP_MAX_ITEMS)

    # ---- DescribeProducers (KIP-664; this broker's replicas) ----
    async def describe_producers(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """The idempotent producers of each partition, from this broker's replica (``kafka-transactions
        describe-producers`` and kafka-python's ``describe_producers`` ask the leader unless given a broker id);
        READ on the topic; NOT_LEADER_OR_FOLLOWER where this broker has no replica. Brook has no transactions:
        every producer's coordinator epoch and transaction start offset are -1."""
        topics = list(req.body.topics)
        await refuse_oversized(ctx, self.broker.metadata_cache, sum(len(t.partition_indexes) for t in topics),
                               "partitions")
        out = await self.service.DescribeProducers(broker_pb2.DescribeProducersRequest(partitions=[
            broker_pb2.DescribeProducersPartition(topic=t.name, partition=p) for t in topics
            for p in t.partition_indexes]), ctx)
        answers = iter(out.partitions)
        return await self._answer(lambda: self._resp(req, {"throttle_time": out.throttle_time_ms, "topics": [
            {"name": t.name, "partitions": [_producers_answer(next(answers)) for _ in t.partition_indexes]}
            for t in topics]}), heavy=sum(len(r.producers) + 1 for r in out.partitions) > _ANSWER_ON_LOOP_MAX_ITEMS)

    # ---- ListConfigResources (KIP-1142; v0: KIP-714's ListClientMetricsResources) ----
    async def list_config_resources(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """The resources whose configs a client may describe, as Kafka 4.1's ``kafka-configs --describe`` without an
        entity name and kafka-python's ``list_config_resources`` list them, after DESCRIBE_CONFIGS on the cluster
        (Kafka's rule). v0 lists client-metrics subscriptions only; v1 the types named, or with none named every
        type Kafka lists (a type outside them fails the whole request UNSUPPORTED_VERSION, as Kafka's does). The
        types come in Kafka's order: groups, client metrics, broker loggers, brokers, topics. Brook has neither
        group configs nor client-metrics subscriptions (KIP-714), so those two list nothing; each broker with an
        endpoint on this listener is listed as a broker and as a broker logger (its loggers are named by its id),
        and every topic by name."""
        def answer(code: int, resources: list[dict[str, Any]]) -> Any:
            return self._resp(req, {"throttle_time": 0, "error_code": code, "config_resources": resources})
        try:
            self._authorize_cluster(ctx, authz.DESCRIBE_CONFIGS)
        except _Failed as exc:
            return answer(exc.code, [])
        if req.api_version == 0:
            return answer(0, [])  # client-metrics subscriptions: Brook has none
        named = {int(t) for t in _get(req.body, "resource_types", ()) or ()}
        if named - LISTED_CONFIG_TYPES:
            return answer(ErrorCode.UNSUPPORTED_VERSION, [])
        wanted = named or LISTED_CONFIG_TYPES
        cache = self.broker.metadata_cache
        nodes = [str(b.node_id) for b in cache.brokers() if b.registered_endpoint(self.listener) is not None]

        def build() -> Any:
            resources = [{"resource_type": kind, "resource_name": node}
                         for kind in (RESOURCE_BROKER_LOGGER, RESOURCE_BROKER) if kind in wanted for node in nodes]
            if RESOURCE_TOPIC in wanted:
                resources += ({"resource_type": RESOURCE_TOPIC, "resource_name": t.name} for t in cache.topics())
            return answer(0, resources)
        # Every topic of a large cluster is named: its list is sorted and the answer built on the admin pool.
        heavy = RESOURCE_TOPIC in wanted and cache.counts()[0] > _ANSWER_ON_LOOP_MAX_ITEMS
        return await self._answer(build, heavy=heavy)

    # ---- DeleteRecords (partitions this broker leads) ----
    async def delete_records(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        size = sum(len(t.partitions) for t in body.topics)
        # Refused before any partition is converted; past _ANSWER_ON_LOOP_MAX_ITEMS the request and its answer are
        # made on the admin pool (a request may name twice the cluster's partitions: 100,000 took 0.15-0.94 s).
        await refuse_oversized(ctx, self.broker.metadata_cache, size, "partitions")
        heavy = size > _ANSWER_ON_LOOP_MAX_ITEMS
        pb = await self._answer(functools.partial(_delete_records_request, body), heavy=heavy)
        out = await self.service.DeleteRecords(pb, ctx)
        return await self._answer(lambda: self._resp(req, {"topics": codec.per_topic(
            (r.topic, {"partition_index": r.partition, "low_watermark": r.low_watermark, "error_code": r.error_code})
            for r in out.partitions), "throttle_time": out.throttle_time_ms}), heavy=heavy)

    # ---- ACLs ----
    def _no_authorizer(self) -> _Failed | None:
        """Kafka answers the ACL APIs SECURITY_DISABLED on a broker without an authorizer: ACLs it stored there
        would enforce nothing, and a DENY a client created looked like protection (KafkaJS audit). ``brook acl``
        (gRPC) still stores them, to be in place before the authorizer is turned on node by node."""
        if self.broker.authorizer.enabled:
            return None
        return _Failed(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on this broker "
                                                    "(authorizer.class.name): ACLs would not be enforced")

    async def describe_acls(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        if (off := self._no_authorizer()) is not None:
            return self._resp(req, {"error_code": off.code, "error_message": off.message, "resources": [],
                                    "throttle_time": 0})
        try:
            f, host = _acl_filter(req.body)
            out = await self._controller(ctx, "DescribeAcls", security_pb2.DescribeAclsRequest(filter=f),
                                         security=True)
        except _MatchesNothing:
            return self._resp(req, {"error_code": 0, "error_message": None, "resources": [], "throttle_time": 0})
        except _Failed as exc:
            return self._resp(req, {"error_code": exc.code, "error_message": exc.message, "resources": [],
                                    "throttle_time": 0})
        def build() -> Any:
            grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
            for a in out.acls:
                if host is not None and a.host != host:
                    continue
                grouped[(a.resource_type, a.resource_name, a.pattern_type)].append(
                    {"principal": a.principal, "host": a.host,
                     "operation": _CODE_OF["operation"].get(a.operation, 0),
                     "permission_type": _CODE_OF["permission"].get(a.permission, 0)})
            resources = [{"resource_type": _CODE_OF["resource"].get(rt, 0), "resource_name": name,
                          "pattern_type": _CODE_OF["pattern"].get(pt, 0), "acls": acls}
                         for (rt, name, pt), acls in sorted(grouped.items())]
            return self._resp(req, {"error_code": 0, "error_message": None, "resources": resources,
                                    "throttle_time": 0})

        # An ANY filter over 10,000 ACLs was built on the event loop: 81 ms (audit).
        return await self._answer(build, heavy=len(out.acls) > _ANSWER_ON_LOOP_MAX_ITEMS)

    async def create_acls(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        creations = list(req.body.creations)
        if (off := self._no_authorizer()) is not None:
            return self._resp(req, {"results": [{"error_code": off.code, "error_message": off.message}
                                                for _ in creations], "throttle_time": 0})
        if len(creations) > MAX_ITEMS_PER_REQUEST:
            # The controller refuses the request whole past this: refused before each creation is checked on the
            # loop (9,990 creations, 288 KB, held it 100 ms to the same end: audit)
            refused = _Failed(ErrorCode.INVALID_REQUEST, f"{len(creations)} ACL creations in one request, at most "
                                                         f"{MAX_ITEMS_PER_REQUEST}: split the request")
            return await self._answer(lambda: self._resp(req, {"throttle_time": 0, "results": [
                {"error_code": refused.code, "error_message": refused.message} for _ in creations]}), heavy=True)
        outcome: list[tuple[int, str] | None] = []
        bindings = []
        for c in creations:
            try:
                binding = _acl_binding(c)
                bindings.append(binding)
                outcome.append(None)
            except _Failed as exc:
                outcome.append((exc.code, exc.message))
        if bindings:
            try:
                await self._controller(ctx, "CreateAcls", security_pb2.CreateAclsRequest(acls=bindings),
                                       security=True)
                done: tuple[int, str] = (0, "")
            except _Failed as exc:
                done = (exc.code, exc.message)
            outcome = [done if o is None else o for o in outcome]
        return self._resp(req, {"results": [{"error_code": code, "error_message": message or None}
                                            for code, message in outcome], "throttle_time": 0})

    async def delete_acls(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """Kafka's DeleteAcls: each filter's result lists the bindings it deleted.

        Bounded, as an audit found 1,000 copies of one filter over 10,000 ACLs (an 8 KB request) matched every
        deleted binding against every filter on the event loop and answered each under every filter: 215 s of
        stalled loop, 6.2 GB, a 259 MB answer. Now at most MAX_ACL_FILTERS filters (the controller's limit, as
        for CreateAcls), each distinct filter forwarded once, and each deleted binding is listed once, under
        the first filter that matched it (Kafka lists it under each): the answer holds each deleted binding
        once, and finding its filter (at most bindings x distinct filters checks, as the controller's own
        walk) runs on the admin pool."""
        kafka_filters = list(req.body.filters)
        if (off := self._no_authorizer()) is not None:
            return self._resp(req, {"throttle_time": 0, "filter_results": [
                {"error_code": off.code, "error_message": off.message, "matching_acls": []} for _ in kafka_filters]})
        if len(kafka_filters) > MAX_ACL_FILTERS:
            refused = _Failed(ErrorCode.INVALID_REQUEST, f"{len(kafka_filters)} ACL filters in one request, at most "
                                                         f"{MAX_ACL_FILTERS}: split the request")
            return await self._answer(lambda: self._resp(req, {"throttle_time": 0, "filter_results": [
                {"error_code": refused.code, "error_message": refused.message, "matching_acls": []}
                for _ in kafka_filters]}), heavy=True)
        # Per filter of the request: its refusal, or the index of its first copy among the distinct filters.
        slots: list[_Failed | int] = []
        distinct: dict[tuple[str, ...], int] = {}
        forwarded: list[security_pb2.AclFilter] = []
        for kf in kafka_filters:
            try:
                f, _ = _acl_filter(kf)  # the host is in the filter, as the controller matches it
            except _Failed as exc:
                slots.append(exc)
                continue
            key = acl_filter_key(f)
            if key not in distinct:
                distinct[key] = len(forwarded)
                forwarded.append(f)
            slots.append(distinct[key])
        deleted: list[security_pb2.AclBinding] = []
        failed: _Failed | None = None
        try:
            if forwarded:
                out = await self._controller(ctx, "DeleteAcls", security_pb2.DeleteAclsRequest(filters=forwarded),
                                             security=True)
                deleted.extend(out.acls)
        except _Failed as exc:
            failed = exc
        answer = functools.partial(self._delete_acls_answer, req, slots, forwarded, deleted, failed)
        return await self._answer(answer, heavy=bool(deleted) or len(slots) > _ANSWER_ON_LOOP_MAX_ITEMS)

    def _delete_acls_answer(self, req: codec.Request, slots: list[_Failed | int],
                            forwarded: list[security_pb2.AclFilter], deleted: list[security_pb2.AclBinding],
                            failed: _Failed | None) -> Any:
        """The DeleteAcls response (on the admin pool): each deleted binding under the first filter matching it."""
        found: list[list[dict[str, Any]]] = [[] for _ in forwarded]
        for a in deleted:
            binding = security_service_binding(a)
            for i, f in enumerate(forwarded):
                if acl_matches_filter(binding, f):
                    found[i].append({
                        "error_code": 0, "resource_type": _CODE_OF["resource"].get(a.resource_type, 0),
                        "resource_name": a.resource_name, "pattern_type": _CODE_OF["pattern"].get(a.pattern_type, 0),
                        "principal": a.principal, "host": a.host,
                        "operation": _CODE_OF["operation"].get(a.operation, 0),
                        "permission_type": _CODE_OF["permission"].get(a.permission, 0)})
                    break
        results = []
        reported: set[int] = set()
        for slot in slots:
            err = slot if isinstance(slot, _Failed) else failed
            if err is not None:
                results.append({"error_code": err.code, "error_message": err.message, "matching_acls": []})
            elif slot in reported:  # a copy of an earlier filter: its bindings are listed there
                results.append({"error_code": 0, "error_message": None, "matching_acls": []})
            else:
                reported.add(slot)
                results.append({"error_code": 0, "error_message": None, "matching_acls": found[slot]})
        return self._resp(req, {"filter_results": results, "throttle_time": 0})

    # ---- ElectLeaders ----
    async def elect_leaders(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        timeout_ms = _ms(body, "timeout", 60000)
        asked = _get(body, "topic_partitions")
        pb = cpb.ElectLeadersRequest(election_type=int(_get(body, "election_type", 0)), timeout_ms=timeout_ms)
        for t in asked or ():
            pb.topic_partitions.add(topic=t.topic, partitions=list(t.partitions))
        if asked is not None and not pb.topic_partitions:
            # An empty list elects nothing (Brook's empty list means every partition).
            return self._resp(req, {"error_code": 0, "replica_election_results": [], "throttle_time": 0})
        try:
            out = await self._controller(ctx, "ElectLeaders", pb, timeout_ms=timeout_ms)
        except _Failed as exc:
            if req.api_version >= 1:
                return self._resp(req, {"error_code": exc.code, "replica_election_results": [], "throttle_time": 0})
            # v0 has no top-level error: every asked partition carries it.
            return self._resp(req, {"throttle_time": 0, "replica_election_results": [
                {"topic": t.topic, "partition_result": [{"partition_id": p, "error_code": exc.code,
                                                         "error_message": exc.message} for p in t.partitions]}
                for t in asked or ()]})
        # Null partitions elect every partition of the cluster: its answer is built off the loop past a few (audit:
        # 20,000 results held the loop 100 ms), as the listings below are
        return await self._answer(lambda: self._resp(req, {
            "error_code": 0, "throttle_time": 0, "replica_election_results": codec.per_topic(
                ((r.topic, {"partition_id": r.partition, "error_code": r.error_code,
                            "error_message": r.error_message or None}) for r in out.results),
                "topic", "partition_result")}), heavy=len(out.results) > _ANSWER_ON_LOOP_MAX_ITEMS)

    # ---- partition reassignments ----
    async def alter_partition_reassignments(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        timeout_ms = _ms(body, "timeout", 60000)
        allow_rf = bool(_get(body, "allow_replication_factor_change", True))  # v1+ (KIP-860)
        pb = cpb.AlterPartitionReassignmentsRequest(timeout_ms=timeout_ms, keep_replication_factor=not allow_rf)
        for t in body.topics:
            for p in t.partitions:
                pb.partitions.add(topic=t.name, partition=p.partition_index, replicas=list(p.replicas or ()),
                                  cancel=p.replicas is None)
        try:
            out = await self._controller(ctx, "AlterPartitionReassignments", pb, timeout_ms=timeout_ms)
        except _Failed as exc:
            return self._resp(req, {"error_code": exc.code, "error_message": exc.message, "responses": [],
                                    "allow_replication_factor_change": allow_rf, "throttle_time": 0})
        return await self._answer(lambda: self._resp(req, {
            "error_code": 0, "error_message": None, "throttle_time": 0, "allow_replication_factor_change": allow_rf,
            "responses": codec.per_topic((r.topic, {"partition_index": r.partition, "error_code": r.error_code,
                                                    "error_message": r.error_message or None}) for r in out.results)}),
            heavy=len(out.results) > _ANSWER_ON_LOOP_MAX_ITEMS)

    async def list_partition_reassignments(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        asked = _get(req.body, "topics")
        pb = cpb.ListPartitionReassignmentsRequest()
        for t in asked or ():
            pb.topic_partitions.add(topic=t.name, partitions=list(t.partition_indexes))
        if asked is not None and not pb.topic_partitions:
            return self._resp(req, {"error_code": 0, "topics": [], "throttle_time": 0})
        try:
            out = await self._controller(ctx, "ListPartitionReassignments", pb)
        except _Failed as exc:
            return self._resp(req, {"error_code": exc.code, "error_message": exc.message, "topics": [],
                                    "throttle_time": 0})
        # Null topics list every reassignment of the cluster: built off the loop past a few (audit: 20,000 held it
        # 210 ms)
        return await self._answer(lambda: self._resp(req, {
            "error_code": 0, "error_message": None, "throttle_time": 0, "topics": codec.per_topic(
                (r.topic, {"partition_index": r.partition, "replicas": list(r.replicas),
                           "adding_replicas": list(r.adding_replicas), "removing_replicas": list(r.removing_replicas)})
                for r in out.reassignments)}), heavy=len(out.reassignments) > _ANSWER_ON_LOOP_MAX_ITEMS)


# ---- translation helpers ----
def budget_left_s(ctx: KafkaCallContext, method: str) -> float:
    """What is left of the request's timeout for one more call to the controllers (30 s without a deadline);
    REQUEST_TIMED_OUT once it is spent. Earlier items of a request may have waited on a controller that did not
    answer: a fresh 30 s for each later item (a remaining 0.0 read as no deadline) had kept an admin worker, and
    the client, N x 30 s (audit)."""
    remaining_s = ctx.time_remaining()
    if remaining_s is None:
        return _DEFAULT_TIMEOUT_S
    if remaining_s <= 0:
        raise _Failed(ErrorCode.REQUEST_TIMED_OUT, f"{method}: the request's timeout passed before it was sent to the "
                                                   f"active controller")
    return remaining_s


def _described(described: dict[str, Any] | _Failed, name: str, *, altering: bool = False) -> Any:
    """Topic ``name``'s entry of ``_describe_topics``; _Failed when it has none or an error."""
    if isinstance(described, _Failed):
        raise described
    r = described.get(name)
    if r is None:
        raise _Failed(ErrorCode.UNKNOWN_SERVER_ERROR, "the controller did not describe this topic")
    if r.error_code:
        raise _Failed(*_topic_error(name, r.error_code, r.error_message, altering=altering))
    return r


def _producers_answer(r: broker_pb2.DescribeProducersPartitionResult) -> dict[str, Any]:
    return {"partition_index": r.partition, "error_code": r.error_code, "error_message": r.error_message or None,
            "active_producers": [{"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
                                  "last_sequence": p.last_sequence, "last_timestamp": p.last_timestamp,
                                  "coordinator_epoch": p.coordinator_epoch,
                                  "current_txn_start_offset": p.current_txn_start_offset} for p in r.producers]}


def _topic_error(name: str, code: int, message: str, *, altering: bool = False) -> tuple[int, str]:
    """A topic config resource's error as Kafka answers it: a name no topic can have is not an unknown topic but
    INVALID_TOPIC_EXCEPTION (Kafka's Topic.validate, before the lookup), and the empty name of an alter is the
    "default topic resource" Kafka's controller refuses. Authorization is decided before, as in Kafka."""
    if code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return code, message
    if altering and name == "":
        return ErrorCode.INVALID_REQUEST, "Default topic resource is not allowed."
    try:
        validate_topic_name(name)
    except errors.BrookError as exc:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, exc.message
    return code, message


def _incremental_ops(res: Any, to_set: dict[str, str], to_delete: list[str],
                     list_ops: dict[str, tuple[int, str]]) -> _Failed | None:
    """One IncrementalAlterConfigs resource's operations sorted into ``to_set``, ``to_delete`` and ``list_ops``
    (APPEND/SUBTRACT, resolved later against the current values); why the resource is refused, or None."""
    nulls = [c.name for c in res.configs if int(c.config_operation) != OP_DELETE and c.value is None]
    if nulls:  # Kafka's brokers refuse these before the controller sees them, with these words
        return _Failed(ErrorCode.INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
    names = [c.name for c in res.configs]
    if len(set(names)) != len(names):
        return _Failed(ErrorCode.INVALID_REQUEST, "a config appears more than once for one resource")
    for c in res.configs:
        op = int(c.config_operation)
        if op == OP_SET:
            to_set[c.name] = c.value
        elif op == OP_DELETE:
            if res.resource_type != RESOURCE_TOPIC or c.name in log_config.TOPIC_CONFIGS:
                to_delete.append(c.name)
            # else nothing: Kafka's controller deletes a topic config that no topic can hold without an
            # error (it was INVALID_CONFIG: audit); `brook topic alter` still names such a key a typo.
        elif op in (OP_APPEND, OP_SUBTRACT):
            if res.resource_type == RESOURCE_BROKER_LOGGER:
                return _Failed(ErrorCode.INVALID_REQUEST,
                               f"{_OP_NAMES[op]} operation is not allowed for the BROKER_LOGGER resource")
            if res.resource_type == RESOURCE_TOPIC or (res.resource_type == RESOURCE_BROKER and not res.resource_name):
                if _list_key(res.resource_type, c.name) is None:  # Kafka's controller's words
                    return _Failed(ErrorCode.INVALID_CONFIG,
                                   f"Can't {_OP_NAMES[op]} to key {c.name} because its type is not LIST.")
                list_ops[c.name] = (op, c.value)
            # any other resource is refused whole by _alter (a broker's own configs, an unknown type)
        else:
            return _Failed(ErrorCode.INVALID_REQUEST, f"unknown config operation {op} for '{c.name}'")
    return None


def _list_key(resource_type: int, name: str) -> log_config.ConfigDef | None:
    """The definition of a LIST-typed key of a TOPIC or of the cluster's defaults (BROKER ''), else None."""
    topic_key = name if resource_type == RESOURCE_TOPIC else cluster_configs.TOPIC_KEY_OF.get(name)
    d = log_config.TOPIC_CONFIGS.get(topic_key) if topic_key is not None else None
    return d if d is not None and d.kind == "list" else None


def _list_op_messages(ops: dict[str, tuple[int, str]]) -> list[cpb.ListOp]:
    return [cpb.ListOp(name=name, subtract=op == OP_SUBTRACT, value=value) for name, (op, value) in ops.items()]


def _screened(resources: list[Any], *, refuse_duplicates: bool = True) -> list[_Failed | None]:
    """For each config resource of a request, why it is refused before anything is done (None: it is not).
    More than MAX_RESOURCES_PER_REQUEST: all of them (POLICY_VIOLATION, as the controller refuses more topics).
    With ``refuse_duplicates`` (the Alter APIs), one named more than once: each copy (INVALID_REQUEST, as
    Kafka's brokers refuse duplicates in AlterConfigs and IncrementalAlterConfigs), so that no resource is
    changed twice. DescribeConfigs answers every copy, as Kafka's ConfigHelper does."""
    if len(resources) > MAX_RESOURCES_PER_REQUEST:
        too_many = _Failed(ErrorCode.POLICY_VIOLATION, f"{len(resources)} resources in one request, the limit is "
                                                        f"{MAX_RESOURCES_PER_REQUEST}: split the request")
        return [too_many] * len(resources)
    if not refuse_duplicates:
        return [None] * len(resources)
    seen: dict[tuple[int, str], int] = defaultdict(int)
    for r in resources:
        seen[(r.resource_type, r.resource_name)] += 1
    duplicate = _Failed(ErrorCode.INVALID_REQUEST, DUPLICATE_RESOURCE)
    return [duplicate if seen[(r.resource_type, r.resource_name)] > 1 else None for r in resources]


def _once_per_name(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A topic's first answer only. The controller refuses a topic named twice in one request at each mention
    (INVALID_REQUEST, none of its copies done); Kafka's answer names such a topic once."""
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        first.setdefault(r["name"], r)
    return list(first.values())


def _builtin_default(name: str) -> str | None:
    """A node config key's built-in value as DescribeConfigs shows it (None: none). Kafka's defaults are on the
    hours keys (log.retention.hours 168, log.roll.hours 168, log.roll.jitter.hours 0), the same time as the key each
    stands for; they showed null (KafkaJS audit). The minutes key has none, as in Kafka."""
    from broker.config import COARSE_UNITS, KEYS

    d = KEYS.get(name)
    if d is None:
        return None
    if d.topic_key is not None:
        return log_config.TOPIC_CONFIGS[d.topic_key].default
    if d.default is not None or name not in COARSE_UNITS or not name.endswith(".hours"):
        return d.default
    fine, factor = COARSE_UNITS[name]
    fine_default = _builtin_default(fine)
    if fine_default is None or int(fine_default) < 0 or int(fine_default) % factor:
        return None
    return str(int(fine_default) // factor)


def client_controller_id(live_brokers: list[int]) -> int:
    """The "controller" a Kafka client is told of (Metadata, DescribeCluster) and sends its admin requests to: a
    live broker at random, as KRaft's brokers answer (any broker forwards them to the active controller). The
    active controller was named: in the split layout a controller-only node no client can reach (confluent-kafka
    waited for it until its timeout, kafka-python failed with UnknownBrokerIdError: no Kafka client could create
    or delete a topic), and with combined nodes every client's admin requests waited out their timeout, 20-80 s,
    while that one node restarted (audits)."""
    return random.choice(live_brokers) if live_brokers else -1


def _permissive(req: codec.Request) -> bool:
    """An API version older than KIP-599's: its client does not know THROTTLING_QUOTA_EXCEEDED."""
    return req.api_version < STRICT_QUOTA_SINCE[req.api_key]


def _creatable_topic(t: Any) -> cpb.CreatableTopic:
    configs = {}
    for c in t.configs:
        if c.value is None:
            raise _Failed(ErrorCode.INVALID_CONFIG, f"null value for topic config '{c.name}'")
        configs[c.name] = c.value
    out = cpb.CreatableTopic(name=t.name, num_partitions=t.num_partitions, replication_factor=t.replication_factor,
                             configs=configs)
    if t.assignments:
        # As Kafka's controller: an assignment stands alone (KIP-464's -1/-1 beside it), the replication factor
        # checked first. Brook's own API takes a count that agrees with the assignment; a Kafka client gets
        # Kafka's answer.
        if t.replication_factor != -1:
            raise _Failed(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but replication "
                                                     "factor was not set to -1.")
        if t.num_partitions != -1:
            raise _Failed(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but "
                                                     "numPartitions was not set to -1.")
        by_index = sorted(t.assignments, key=lambda a: a.partition_index)
        if [a.partition_index for a in by_index] != list(range(len(by_index))):
            raise _Failed(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                          "the assigned partitions must be 0..n-1, each once")
        out.assignments.extend(cpb.ReplicaList(replicas=list(a.broker_ids)) for a in by_index)
    return out


def _topic_row(e: Any) -> _ConfigRow:
    """A topic config as the controller described it: an override (DYNAMIC_TOPIC_CONFIG, its own synonym) or
    the default."""
    source = SOURCE_DEFAULT if e.is_default else SOURCE_DYNAMIC_TOPIC
    return (e.name, e.value, source, False, e.documentation, False,
            () if e.is_default else ((e.name, e.value, source),))


def _topic_defaults(own: list[_ConfigRow]) -> dict[str, _ConfigRow]:
    """Topic config name -> this broker's row (``own``: its own configs) for the broker key that stands for it
    (retention.ms -> log.retention.ms): what a topic without its own value uses here, and where that comes
    from. Shown to whoever may describe the topic's configs, as Kafka's broker does (no topic default is a
    secret)."""
    from broker.config import KEYS

    broker_key = {d.topic_key: name for name, d in KEYS.items() if d.topic_key is not None}
    rows = {row[0]: row for row in own}
    return {topic: rows[key] for topic, key in broker_key.items() if key in rows}


def _with_broker_synonyms(row: _ConfigRow, broker_row: _ConfigRow | None) -> _ConfigRow:
    """A topic config as Kafka's broker describes it (ConfigHelper.createTopicConfigEntry): not set on the topic,
    its value and source are the broker's for the key that stands for it (a dynamic cluster default
    DYNAMIC_DEFAULT_BROKER_CONFIG, the node's file STATIC_BROKER_CONFIG, else DEFAULT_CONFIG); its synonyms
    are the topic's own value, if set, then every broker-level one (log.retention.ms, log.retention.hours,
    ..., the default last). Brook listed a default with no synonyms and always as DEFAULT_CONFIG."""
    if broker_row is None:
        return row
    name, value, source, sensitive, doc, read_only, synonyms = row
    _key, broker_value, broker_source, _sensitive, _doc, _read_only, broker_synonyms = broker_row
    if source == SOURCE_DEFAULT and broker_value is not None:
        value, source = broker_value, broker_source
    return name, value, source, sensitive, doc, read_only, (*synonyms, *broker_synonyms)


def _topic_config_entry(row: _ConfigRow, broker_row: _ConfigRow | None) -> dict[str, Any]:
    """A CreateTopics (v5+) config entry: the value and source DescribeConfigs shows (``_with_broker_synonyms``)."""
    name, value, source, *_ = _with_broker_synonyms(row, broker_row)
    return {"name": name, "value": value, "read_only": False, "is_sensitive": False, "config_source": source}


def _acl_binding(c: Any) -> security_pb2.AclBinding:
    """A Kafka AclCreation as Brook's binding; _Failed(INVALID_REQUEST) for what Brook cannot hold."""
    names = []
    for kind, value in (("resource", c.resource_type), ("pattern", c.resource_pattern_type),
                        ("operation", c.operation), ("permission", c.permission_type)):
        table = {v: k for k, v in _CODE_OF[kind].items()}
        if int(value) not in table:
            raise _Failed(ErrorCode.INVALID_REQUEST, f"Brook has no ACL {kind} type {int(value)}")
        names.append(table[int(value)])
    rtype, pattern, operation, permission = names
    if not c.host:
        # Kafka stores an empty host, and it matches no client; it was stored as "*", every client (audit).
        raise _Failed(ErrorCode.INVALID_REQUEST, "an ACL's host is '*' (any) or a client address, not empty")
    try:
        b = sec.new_acl_binding([rtype, c.resource_name, pattern, c.principal, c.host, operation, permission])
    except errors.BrookError as exc:
        raise _Failed(exc.code, exc.message) from None
    return security_pb2.AclBinding(resource_type=b.resource_type, resource_name=b.resource_name,
                                   pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                                   operation=b.operation, permission=b.permission)


def _acl_filter(f: Any) -> tuple[security_pb2.AclFilter, str | None]:
    """A Kafka ACL filter as Brook's (empty = any) plus the host to match (None = any)."""
    def one(kind: str, value: int, *, match_ok: bool = False) -> str:
        value = int(value)
        if value == _ANY:
            return ""
        if match_ok and value == _MATCH:
            return "MATCH"
        table = {v: k for k, v in _CODE_OF[kind].items()}
        if value not in table:
            raise _Failed(ErrorCode.INVALID_REQUEST, f"ACL filter: Brook has no {kind} type {value}")
        return table[value]

    if "" in (f.resource_name_filter, f.principal_filter, f.host_filter):
        # Kafka's filters take null for "any"; an empty name, principal or host matches only bindings that have
        # one, and none has. It was read as "any": a DeleteAcls with host "" deleted the bindings of every host.
        raise _MatchesNothing()
    try:  # the host as bindings store it (canonical IP), so that a filter finds them however it is written
        host = sec.acl_host(f.host_filter) if f.host_filter else None
    except ValueError:
        host = f.host_filter  # no binding has it: the filter matches nothing
    out = security_pb2.AclFilter(
        resource_type=one("resource", f.resource_type_filter), resource_name=f.resource_name_filter or "",
        pattern_type=one("pattern", _get(f, "pattern_type_filter", 3), match_ok=True),
        principal=f.principal_filter or "", operation=one("operation", f.operation),
        permission=one("permission", f.permission_type), host=host or "")
    return out, host


def security_service_binding(a: security_pb2.AclBinding) -> sec.AclBinding:
    return sec.AclBinding(a.resource_type, a.resource_name, a.pattern_type, a.principal, a.host, a.operation,
                          a.permission)


def cluster_authorized_operations(authorizer: authz.Authorizer, caller: Any) -> int:
    """KIP-430's cluster_authorized_operations (DescribeCluster, Metadata v8-v10), as Kafka answers it: the
    caller's operations on the cluster when it may DESCRIBE the cluster, else none (0)."""
    ops = authorizer.authorized_operations(caller, authz.CLUSTER)
    return ops if ops & (1 << authz.OPERATION_CODES[authz.DESCRIBE]) else 0


def _delete_records_request(body: Any) -> broker_pb2.DeleteRecordsRequest:
    pb = broker_pb2.DeleteRecordsRequest(timeout_ms=_ms(body, "timeout", 30000))
    for t in body.topics:
        for p in t.partitions:
            pb.partitions.add(topic=t.name, partition=p.partition_index, offset=p.offset)
    return pb
