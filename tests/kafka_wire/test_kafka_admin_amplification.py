"""What one admin request may make a broker's Kafka listener do, on a real KafkaListener in this process (real
sockets, raw frames). The broker behind it is a fake that counts its work: the controller calls it forwards,
the ACL matches it evaluates, how often it reads its own configs, the partitions it hands to its services.

Found by an audit, each from one small request:
- DescribeConfigs naming one topic or broker 9,999 times (50 KB) expanded every copy again, with
  documentation and synonyms, on the event loop: 4 s stalled (17 s and 778 MB for the broker resource);
- IncrementalAlterConfigs naming the BROKER resource '' 9,999 times (40 KB) made 9,999 controller calls;
- DeleteAcls with 1,000 copies of one filter over 10,000 ACLs (8 KB) matched every deleted ACL against every
  filter on the loop and listed each under every filter: 215 s stalled, 6.2 GB, a 259 MB answer;
- arrays of int32 partition indexes were not counted by the frame's element bound, and DescribeLogDirs and
  OffsetFetch expanded 2M of them (8 MB) on the loop before any bound or ACL check."""

from __future__ import annotations

import threading
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from raw_frames import ask, frame

from broker.admission import refuse_over
from broker.kafka_wire import admin_apis, bounds, codec
from broker.kafka_wire.server import KafkaListener, KafkaListenerSpec
from metadata_quorum import security as sec
from metadata_quorum.security_service import acl_matches_filter
from proto import broker_pb2, errors, group_pb2, security_pb2
from proto import controller_pb2 as cpb
from proto.errors import ErrorCode

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
DELETE_ACLS, DESCRIBE_LOG_DIRS, OFFSET_FETCH, DESCRIBE_ACLS = 31, 35, 9, 29
CREATE_TOPICS, CREATE_ACLS, FIND_COORDINATOR, ALTER_CLIENT_QUOTAS = 19, 30, 10, 49
LIST_PARTITION_REASSIGNMENTS, ELECT_LEADERS, DESCRIBE_USER_SCRAM_CREDENTIALS, DESCRIBE_CLIENT_QUOTAS = 46, 43, 50, 48
TOPIC, BROKER = admin_apis.RESOURCE_TOPIC, admin_apis.RESOURCE_BROKER
NODE_ID = 1
TOPICS = {"t", "u"}
DENIED_GROUP = "not-yours"
LIMIT = 1000  # resources (DescribeConfigs, AlterConfigs) and ACL filters a request may name: the controller's
DUPLICATE = "Each resource must appear at most once."  # Kafka's answer to each copy of a config resource


class FakeController:
    """The active controller as the broker's ControllerClient (and SecurityControllerClient) reach it: each
    call recorded, answered as Brook's controller answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.acls: list[sec.AclBinding] = []
        self.quota_calls = []

    def call(self, method: str, request: Any, *, timeout_s: float = 0, metadata: Any = ()) -> Any:
        self.calls.append((method, request))
        return getattr(self, method)(request)

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]

    def DescribeConfigs(self, req: cpb.DescribeConfigsRequest) -> cpb.DescribeConfigsResponse:  # noqa: N802
        out = cpb.DescribeConfigsResponse()
        for name in dict.fromkeys(req.topics):  # each topic once, as the controller (e09bd4b)
            r = out.results.add(topic=name)
            if name not in TOPICS:
                r.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            r.entries.add(name="retention.ms", value="1000", is_default=False, documentation="How long.")
            r.entries.add(name="segment.bytes", value="1024", is_default=True, documentation="How big.")
        return out

    def AlterConfigs(self, req: cpb.AlterConfigsRequest) -> cpb.AlterConfigsResponse:  # noqa: N802
        out = cpb.AlterConfigsResponse()
        for r in req.resources:
            out.results.add(name=r.topic)
        return out

    def AlterClusterConfigs(self, req: Any) -> cpb.AlterClusterConfigsResponse:  # noqa: N802
        return cpb.AlterClusterConfigsResponse()

    def DescribeAcls(self, req: security_pb2.DescribeAclsRequest) -> security_pb2.AclsResponse:  # noqa: N802
        return security_pb2.AclsResponse(acls=[security_pb2.AclBinding(
            resource_type=b.resource_type, resource_name=b.resource_name, pattern_type=b.pattern_type,
            principal=b.principal, host=b.host, operation=b.operation, permission=b.permission)
            for b in self.acls if acl_matches_filter(b, req.filter)])

    def CreateAcls(self, req: security_pb2.CreateAclsRequest) -> security_pb2.AclsResponse:  # noqa: N802
        return security_pb2.AclsResponse()

    def DeleteAcls(self, req: security_pb2.DeleteAclsRequest) -> security_pb2.AclsResponse:  # noqa: N802
        doomed = [b for b in self.acls if any(acl_matches_filter(b, f) for f in req.filters)]
        self.acls = [b for b in self.acls if b not in doomed]
        return security_pb2.AclsResponse(acls=[security_pb2.AclBinding(
            resource_type=b.resource_type, resource_name=b.resource_name, pattern_type=b.pattern_type,
            principal=b.principal, host=b.host, operation=b.operation, permission=b.permission) for b in doomed])


    def CreateTopics(self, req: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:  # noqa: N802
        return cpb.CreateTopicsResponse(results=[cpb.TopicResult(name=t.name, topic_id=f"{i:032x}", num_partitions=1,
                                                                 replication_factor=1)
                                                 for i, t in enumerate(req.topics)])

    earlier_release = False  # AlterClientQuotas as an active controller without ``alterations`` answers it
    quota_calls: list[int] = []  # each AlterClientQuotas call's entities

    def AlterClientQuotas(self, req: security_pb2.AlterClientQuotasRequest) -> security_pb2.ClientQuotasResponse:  # noqa: N802
        self.quota_calls.append(len(req.alterations) or 1)
        if not req.alterations or self.earlier_release:
            if not req.entity:  # an earlier release reads only entity: empty, it refuses the request
                raise errors.InvalidRequestError("principal '' is not TYPE:NAME")
            return security_pb2.ClientQuotasResponse()
        out = security_pb2.ClientQuotasResponse()
        for a in req.alterations:  # as the controller: each checked and answered, in order
            r = out.results.add(entity=a.entity)
            if a.entity == "User:refused":
                r.error_code, r.error_message = ErrorCode.INVALID_REQUEST, "more than 10000 quota entities"
        return out

    listed = 5  # how many reassignments, election results, users and quotas the listings below answer

    def ListPartitionReassignments(self, req: Any) -> cpb.ListPartitionReassignmentsResponse:  # noqa: N802
        return cpb.ListPartitionReassignmentsResponse(reassignments=[
            cpb.OngoingReassignment(topic="t", partition=p, replicas=[1, 2], adding_replicas=[2])
            for p in range(self.listed)])

    def ElectLeaders(self, req: Any) -> cpb.ElectLeadersResponse:  # noqa: N802
        return cpb.ElectLeadersResponse(results=[cpb.ElectionResult(topic="t", partition=p, leader=1)
                                                 for p in range(self.listed)])

    def DescribeUsers(self, req: Any) -> security_pb2.DescribeUsersResponse:  # noqa: N802
        return security_pb2.DescribeUsersResponse(users=[security_pb2.UserDescription(user=f"u{i}", mechanisms=[
            security_pb2.UserDescription.Mechanism(mechanism="SCRAM-SHA-256", iterations=4096)])
            for i in range(self.listed)])

    def DescribeClientQuotas(self, req: Any) -> security_pb2.ClientQuotasResponse:  # noqa: N802
        return security_pb2.ClientQuotasResponse(quotas=[
            security_pb2.QuotaRecord(entity=f"User:u{i}", values={"producer_byte_rate": 1000.0})
            for i in range(self.listed)])


class FakeBroker(types.SimpleNamespace):
    """What the listener's handlers read of a BrokerServer, counting the reads that cost."""

    def __init__(self) -> None:
        self.controller = FakeController()
        self.node_reads = 0  # the node's view of its configs (dynamic cluster configs) read
        self.authorizations = 0
        self.log_dirs_asked: list[broker_pb2.DescribeLogDirsRequest] = []
        self.offsets_asked: list[group_pb2.OffsetFetchRequest] = []
        self.coordinators_asked: list[str] = []
        broker = self

        def cluster_configs() -> dict[str, str]:
            broker.node_reads += 1
            return {"log.retention.ms": "60000"}

        def authorize(*_: Any) -> bool:
            broker.authorizations += 1
            return True

        async def describe_log_dirs(request: broker_pb2.DescribeLogDirsRequest, ctx: Any) -> Any:
            broker.log_dirs_asked.append(request)
            d = broker_pb2.LogDirDescription(path="/data", total_bytes=10, usable_bytes=5)
            for p in range(4):
                d.partitions.add(topic="t", partition=p, size_bytes=p)
            return broker_pb2.DescribeLogDirsResponse(broker_id=NODE_ID, dirs=[d])

        async def offset_fetch(request: group_pb2.OffsetFetchRequest, ctx: Any) -> Any:
            broker.offsets_asked.append(request)
            return group_pb2.OffsetFetchResponse(partitions=[group_pb2.CommittedOffset(
                topic=p.topic, partition=p.partition, offset=7, leader_epoch=-1) for p in request.partitions])

        async def find_coordinator(request: group_pb2.FindCoordinatorRequest, ctx: Any) -> Any:
            broker.coordinators_asked.append(request.group_id)
            return group_pb2.FindCoordinatorResponse(node_id=NODE_ID, host="h", port=9092)

        async def refuse_too_many_groups(count: int, ctx: Any) -> None:  # a coordinator holding no group
            await refuse_over(ctx, count, "groups", 0, "this coordinator holds 0 groups")

        def refused(ctx: Any, operation: str, group_id: str, response_cls: type) -> Any:
            if group_id != DENIED_GROUP:
                return None
            return response_cls(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message="denied")

        super().__init__(
            node_id=NODE_ID, controller_client=self.controller,
            settings=types.SimpleNamespace(defaults={"log.dirs": "/data", "sasl.jaas.config": "secret"}),
            metadata_cache=types.SimpleNamespace(counts=lambda: (2, 4), cluster_configs=cluster_configs),
            authorizer=types.SimpleNamespace(authorize=authorize, enabled=True),  # ACL APIs served (SECURITY_DISABLED without)
            service=types.SimpleNamespace(DescribeLogDirs=describe_log_dirs),
            group_servicer=types.SimpleNamespace(OffsetFetch=offset_fetch, _refused=refused,
                                                 refuse_too_many_groups=refuse_too_many_groups,
                                                 FindCoordinator=find_coordinator))


@pytest.fixture()
async def listener() -> AsyncIterator[KafkaListener]:
    broker = FakeBroker()
    lst = KafkaListener(broker, KafkaListenerSpec("KAFKA", "127.0.0.1", 0, "PLAINTEXT"),
                        {"kafka.request.timeout.ms": "30000"})
    lst.apis.admin._security = lambda: broker.controller  # type: ignore[method-assign]
    await lst.start()
    try:
        yield lst
    finally:
        await lst.stop()


async def _ask(lst: KafkaListener, api_key: int, version: int, values: dict[str, Any]) -> Any:
    """The decoded answer; None when the listener closed the connection instead."""
    assert codec.request_schema(api_key, version).__flexible__
    return await ask(lst.port, frame(api_key, version, values, client_id="amplification-test"), api_key, version)


def _broker(lst: KafkaListener) -> FakeBroker:
    return lst.broker  # type: ignore[no-any-return]


def _resource(kind: int, name: str, **more: Any) -> dict[str, Any]:
    return {"resource_type": kind, "resource_name": name, **more}


def _record_where_answers_are_built(lst: KafkaListener) -> list[bool]:
    """Each admin answer's ``heavy`` (True: built on the admin pool, off the event loop), as it is built."""
    admin = lst.apis.admin
    built_off_the_loop: list[bool] = []
    answer = admin._answer

    async def recorded(build: Callable[[], Any], *, heavy: bool) -> Any:
        built_off_the_loop.append(heavy)
        return await answer(build, heavy=heavy)

    admin._answer = recorded  # type: ignore[method-assign]
    return built_off_the_loop


# ---- DescribeConfigs ----
async def test_describe_configs_answers_each_copy_but_asks_and_reads_once(
        listener: KafkaListener) -> None:
    broker = _broker(listener)
    asked = ([_resource(TOPIC, "t", configuration_keys=None)] * 50 + [_resource(TOPIC, "u", configuration_keys=None)]
             + [_resource(BROKER, str(NODE_ID), configuration_keys=None)] * 3
             + [_resource(BROKER, "", configuration_keys=None), _resource(BROKER, "2", configuration_keys=None)])
    answer = await _ask(listener, DESCRIBE_CONFIGS, 4, {"resources": asked, "include_synonyms": True,
                                                        "include_documentation": True})
    assert [(r.resource_type, r.resource_name) for r in answer.results] == \
        [(r["resource_type"], r["resource_name"]) for r in asked]  # one answer a resource, in order
    by_error = [(r.resource_name, int(r.error_code), len(r.configs)) for r in answer.results]
    # As Kafka's ConfigHelper: every copy answered, the same way.
    assert len(set(by_error[:50])) == 1 and by_error[0][1] == 0 and by_error[0][2] > 0
    assert len(set(by_error[51:54])) == 1 and by_error[51][1] == 0 and by_error[51][2] > 0
    assert by_error[50][:2] == ("u", 0) and by_error[54][:2] == ("", 0)
    assert by_error[55][:2] == ("2", ErrorCode.INVALID_REQUEST)  # another broker's configs
    u = {c.name: c for c in answer.results[50].configs}
    assert u["retention.ms"].value == "1000" and u["retention.ms"].documentation == "How long."
    # The topic's own value, then the broker-level ones (the dynamic cluster default, the default), as Kafka.
    assert [(s.name, s.value) for s in u["retention.ms"].synonyms] == \
        [("retention.ms", "1000"), ("log.retention.ms", "60000"), ("log.retention.ms", "604800000")]
    cluster_defaults = {c.name: c.value for c in answer.results[54].configs}
    assert cluster_defaults == {"log.retention.ms": "60000"}
    # The work: one controller call naming each topic once, the node's configs read and authorized once.
    assert [(m, list(r.topics)) for m, r in broker.controller.calls] == [("DescribeConfigs", ["t", "u"])]
    assert broker.node_reads == 1 and broker.authorizations == 1


async def test_describe_configs_reads_the_node_once_for_both_broker_resources(listener: KafkaListener) -> None:
    broker = _broker(listener)
    answer = await _ask(listener, DESCRIBE_CONFIGS, 4, {"resources": [
        _resource(BROKER, "", configuration_keys=None), _resource(BROKER, str(NODE_ID), configuration_keys=None)]})
    assert [int(r.error_code) for r in answer.results] == [0, 0]
    mine = {c.name: c for c in answer.results[1].configs}
    assert mine["log.retention.ms"].value == "60000" and mine["log.dirs"].read_only
    assert mine["sasl.jaas.config"].is_sensitive and mine["sasl.jaas.config"].value is None
    assert broker.node_reads == 1 and broker.authorizations == 1
    assert broker.controller.calls == []


async def test_describe_configs_of_more_than_one_node_resource_is_built_off_the_loop(listener: KafkaListener) -> None:
    # Each node resource lists every node config key (about 130) with documentation and synonyms: 100 copies of one
    # were built on the event loop, 127 ms (audit). One is cheap and stays there.
    built_off_the_loop = _record_where_answers_are_built(listener)
    for resources in ([_resource(BROKER, str(NODE_ID), configuration_keys=None)],
                      [_resource(BROKER, str(NODE_ID), configuration_keys=None)] * 2):
        out = await _ask(listener, DESCRIBE_CONFIGS, 4, {"resources": resources})
        assert [int(r.error_code) for r in out.results] == [0] * len(resources)
    assert built_off_the_loop == [False, True], built_off_the_loop


async def test_describe_configs_over_the_limit_is_refused_without_a_controller_call(listener: KafkaListener) -> None:
    broker = _broker(listener)
    many = [_resource(TOPIC, f"t{i}", configuration_keys=None) for i in range(LIMIT + 1)]
    answer = await _ask(listener, DESCRIBE_CONFIGS, 4, {"resources": many})
    assert len(answer.results) == len(many)
    assert {int(r.error_code) for r in answer.results} == {ErrorCode.POLICY_VIOLATION}
    assert "limit is 1000" in answer.results[0].error_message
    assert broker.controller.calls == []


def test_the_limits_are_the_controllers() -> None:
    from metadata_quorum.controller import MAX_TOPICS_PER_REQUEST
    from metadata_quorum.security_service import MAX_ITEMS_PER_REQUEST

    assert admin_apis.MAX_RESOURCES_PER_REQUEST == MAX_TOPICS_PER_REQUEST == LIMIT
    assert admin_apis.MAX_ACL_FILTERS == MAX_ITEMS_PER_REQUEST == LIMIT
    assert admin_apis.DUPLICATE_RESOURCE == DUPLICATE


# ---- AlterConfigs / IncrementalAlterConfigs ----
def _set(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "config_operation": 0, "value": value}


async def test_incremental_alter_configs_refuses_duplicates_and_makes_one_call_per_kind(
        listener: KafkaListener) -> None:
    controller = _broker(listener).controller
    cluster_default = _resource(BROKER, "", configs=[_set("log.retention.ms", "1000")])
    asked = ([cluster_default] * 3 + [_resource(TOPIC, "t", configs=[_set("retention.ms", "1")])] * 2
             + [_resource(TOPIC, "u", configs=[_set("retention.ms", "2")]), _resource(BROKER, "1", configs=[])])
    answer = await _ask(listener, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": asked, "validate_only": True})
    assert [(r.resource_name, int(r.error_code)) for r in answer.responses] == \
        [("", ErrorCode.INVALID_REQUEST)] * 3 + [("t", ErrorCode.INVALID_REQUEST)] * 2 + \
        [("u", 0), ("1", ErrorCode.INVALID_REQUEST)]
    assert answer.responses[0].error_message == DUPLICATE
    # No controller call for the refused copies (each BROKER '' copy was one), one for the topic left.
    assert [(m, [x.topic for x in r.resources]) for m, r in controller.calls] == [("AlterConfigs", ["u"])]

    controller.calls.clear()
    answer = await _ask(listener, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [
        cluster_default, _resource(TOPIC, "u", configs=[])], "validate_only": True})
    assert [int(r.error_code) for r in answer.responses] == [0, 0]
    assert controller.methods() == ["AlterClusterConfigs", "AlterConfigs"]
    assert dict(controller.calls[0][1].set) == {"log.retention.ms": "1000"}


async def test_legacy_alter_configs_refuses_duplicates_and_too_many(listener: KafkaListener) -> None:
    controller = _broker(listener).controller
    cluster_default = _resource(BROKER, "", configs=[{"name": "log.retention.ms", "value": "1000"}])
    answer = await _ask(listener, ALTER_CONFIGS, 2, {"resources": [cluster_default] * 2, "validate_only": True})
    assert [int(r.error_code) for r in answer.responses] == [ErrorCode.INVALID_REQUEST] * 2
    assert controller.calls == []
    many = [_resource(TOPIC, f"t{i}", configs=[]) for i in range(LIMIT + 1)]
    answer = await _ask(listener, ALTER_CONFIGS, 2, {"resources": many, "validate_only": True})
    assert {int(r.error_code) for r in answer.responses} == {ErrorCode.POLICY_VIOLATION}
    assert controller.calls == []
    answer = await _ask(listener, ALTER_CONFIGS, 2, {"resources": [cluster_default], "validate_only": True})
    assert [int(r.error_code) for r in answer.responses] == [0]
    assert controller.methods() == ["AlterClusterConfigs"]


# ---- DeleteAcls ----
ANY_FILTER = {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
              "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}


def _acls(n: int) -> list[sec.AclBinding]:
    return [sec.AclBinding("TOPIC" if i % 2 else "GROUP", f"acl-{i}", "LITERAL", "User:x", "*", "READ", "ALLOW")
            for i in range(n)]


def _counting_matches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each ACL match the handler evaluates, as the name of the thread it ran on."""
    threads: list[str] = []
    real: Callable[..., bool] = admin_apis.acl_matches_filter

    def counting(*args: Any) -> bool:
        threads.append(threading.current_thread().name)
        return real(*args)
    monkeypatch.setattr(admin_apis, "acl_matches_filter", counting)
    return threads


async def test_delete_acls_lists_each_deleted_binding_once_and_matches_each_once_off_the_loop(
        listener: KafkaListener, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = _broker(listener).controller
    controller.acls = _acls(300)
    matches = _counting_matches(monkeypatch)
    answer = await _ask(listener, DELETE_ACLS, 3, {"filters": [ANY_FILTER] * 1000})
    # The work: the filter forwarded once, one match a deleted binding (not 1,000), none on the event loop.
    assert [len(r.filters) for _, r in controller.calls] == [1]
    assert len(matches) == 300, f"{len(matches)} matches for 300 deleted ACLs"
    assert {t for t in matches if not t.startswith("kafka-admin-")} == set(), "matched on the event loop"
    results = answer.filter_results
    assert len(results) == 1000 and {int(r.error_code) for r in results} == {0}
    assert len(results[0].matching_acls) == 300  # each deleted binding once, under the first filter matching it
    assert all(not r.matching_acls for r in results[1:])
    assert {(m.resource_name, m.principal, m.host) for m in results[0].matching_acls} == \
        {(b.resource_name, "User:x", "*") for b in _acls(300)}


async def test_delete_acls_lists_a_binding_under_the_first_distinct_filter_matching_it(
        listener: KafkaListener) -> None:
    controller = _broker(listener).controller
    controller.acls = _acls(10)
    groups_only = {**ANY_FILTER, "resource_type_filter": 3}  # GROUP
    nothing = {**ANY_FILTER, "principal_filter": "User:nobody"}
    answer = await _ask(listener, DELETE_ACLS, 3, {"filters": [nothing, groups_only, ANY_FILTER, groups_only]})
    listed = [sorted(m.resource_name for m in r.matching_acls) for r in answer.filter_results]
    assert listed == [[], sorted(f"acl-{i}" for i in range(0, 10, 2)), sorted(f"acl-{i}" for i in range(1, 10, 2)),
                      []]
    assert controller.acls == []


async def test_delete_acls_over_the_limit_is_refused_without_a_controller_call(listener: KafkaListener) -> None:
    controller = _broker(listener).controller
    controller.acls = _acls(10)
    answer = await _ask(listener, DELETE_ACLS, 3, {"filters": [ANY_FILTER] * (LIMIT + 1)})
    assert {int(r.error_code) for r in answer.filter_results} == {ErrorCode.INVALID_REQUEST}
    assert len(answer.filter_results) == LIMIT + 1
    assert controller.calls == [] and len(controller.acls) == 10


async def test_create_acls_over_the_limit_is_refused_before_any_creation_is_checked(
        listener: KafkaListener, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each creation was checked on the event loop before the controller refused the request whole past its limit:
    # 9,990 creations (288 KB) held the loop 100 ms to that end (audit).
    controller = _broker(listener).controller
    checked: list[Any] = []
    check = admin_apis._acl_binding
    monkeypatch.setattr(admin_apis, "_acl_binding", lambda c: (checked.append(c), check(c))[1])
    creation = {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3, "principal": "User:x",
                "host": "*", "operation": 3, "permission_type": 3}
    answer = await _ask(listener, CREATE_ACLS, 3, {"creations": [creation] * (LIMIT + 1)})
    assert {int(r.error_code) for r in answer.results} == {ErrorCode.INVALID_REQUEST}
    assert len(answer.results) == LIMIT + 1 and "split the request" in answer.results[0].error_message
    assert checked == [] and controller.calls == [] and controller.acls == []
    answer = await _ask(listener, CREATE_ACLS, 3, {"creations": [creation] * 2})  # within it: checked and sent
    assert [int(r.error_code) for r in answer.results] == [0, 0], answer
    assert len(checked) == 2 and controller.methods() == ["CreateAcls"], controller.calls


# ---- int32 arrays: the frame's element bound, then the handlers' bounds and ACLs before expanding ----
def _log_dirs(partitions: int) -> dict[str, Any]:
    return {"topics": [{"topic": "t", "partitions": range(partitions)}]}


def _offsets(group: str, partitions: int) -> dict[str, Any]:
    return {"group_id": group, "topics": [{"name": "t", "partition_indexes": range(partitions)}],
            "require_stable": False}


async def test_int32_partition_indexes_count_against_the_frames_element_bound(listener: KafkaListener) -> None:
    broker = _broker(listener)
    assert listener.max_elements() == bounds.MIN_ELEMENTS  # a small cluster
    for api_key, version, values in ((DESCRIBE_LOG_DIRS, 4, _log_dirs(bounds.MIN_ELEMENTS)),
                                     (OFFSET_FETCH, 7, _offsets("g", bounds.MIN_ELEMENTS))):
        malformed = listener.stats.malformed_requests_total
        assert await _ask(listener, api_key, version, values) is None, "answered"
        assert listener.stats.malformed_requests_total == malformed + 1, "not refused as the frame was read"
    assert broker.log_dirs_asked == [] and broker.offsets_asked == []


async def test_describe_log_dirs_bounds_its_partitions_before_expanding_them(listener: KafkaListener) -> None:
    broker = _broker(listener)
    # Within the frame's bound, above what a request may name in a cluster of 4 partitions (1,000).
    assert await _ask(listener, DESCRIBE_LOG_DIRS, 4, _log_dirs(5_000)) is None
    assert broker.log_dirs_asked == []
    answer = await _ask(listener, DESCRIBE_LOG_DIRS, 4, {"topics": [{"topic": "t", "partitions": [1, 3]}]})
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in answer.results[0].topics] == [("t", [1, 3])]
    assert [list(r.topics) for r in broker.log_dirs_asked] == [["t"]]


async def test_offset_fetch_bounds_its_partitions_and_checks_the_group_acl_before_expanding_them(
        listener: KafkaListener) -> None:
    broker = _broker(listener)
    assert await _ask(listener, OFFSET_FETCH, 7, _offsets("g", 5_000)) is None
    assert broker.offsets_asked == []
    denied = await _ask(listener, OFFSET_FETCH, 7, _offsets(DENIED_GROUP, 900))
    assert int(denied.error_code) == ErrorCode.GROUP_AUTHORIZATION_FAILED and denied.topics == ()
    assert broker.offsets_asked == [], "the partitions of a group the client may not describe were expanded"
    answer = await _ask(listener, OFFSET_FETCH, 7, _offsets("g", 3))
    assert int(answer.error_code) == 0
    assert [(p.partition_index, p.committed_offset) for p in answer.topics[0].partitions] == [(0, 7), (1, 7), (2, 7)]
    assert [len(r.partitions) for r in broker.offsets_asked] == [3]


async def test_offset_fetch_of_several_groups_bounds_them_and_answers_each_as_its_own(listener: KafkaListener) -> None:
    """v8 (KIP-709): as many groups as DeleteGroups may name (max(1000, twice the coordinator's)), each answered as
    a v7 request of its own would be: a group the client may not DESCRIBE refused alone, nothing expanded for it."""
    broker = _broker(listener)
    many = {"groups": [{"group_id": f"g{i}", "topics": None} for i in range(1001)]}
    assert await _ask(listener, OFFSET_FETCH, 8, many) is None
    assert broker.offsets_asked == []
    one = _offsets("g", 2)["topics"]
    answer = await _ask(listener, OFFSET_FETCH, 8, {"groups": [
        {"group_id": "g", "topics": one}, {"group_id": DENIED_GROUP, "topics": one}, {"group_id": "h", "topics": None}]})
    assert [(g.group_id, int(g.error_code), [(p.partition_index, p.committed_offset) for t in g.topics
                                              for p in t.partitions]) for g in answer.groups] == [
        ("g", 0, [(0, 7), (1, 7)]), (DENIED_GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED, []), ("h", 0, [])]
    assert [(r.group_id, len(r.partitions)) for r in broker.offsets_asked] == [("g", 2), ("h", 0)]


async def test_long_log_dir_and_acl_listings_are_built_off_the_loop(listener: KafkaListener) -> None:
    # DescribeLogDirs of every partition (null topics) and DescribeAcls with an ANY filter were built on the event
    # loop: 86 ms for 20,000 partitions, 81 ms for 10,000 ACLs (audit). Short ones stay there.
    broker = _broker(listener)
    built_off_the_loop = _record_where_answers_are_built(listener)
    short = await _ask(listener, DESCRIBE_LOG_DIRS, 4, {"topics": None})
    assert sum(len(t.partitions) for r in short.results for t in r.topics) == 4
    many = broker_pb2.LogDirDescription(path="/data", total_bytes=10, usable_bytes=5)
    for p in range(300):
        many.partitions.add(topic="t", partition=p, size_bytes=p)

    async def all_partitions(request: Any, ctx: Any) -> Any:
        return broker_pb2.DescribeLogDirsResponse(broker_id=NODE_ID, dirs=[many])

    broker.service.DescribeLogDirs = all_partitions
    long = await _ask(listener, DESCRIBE_LOG_DIRS, 4, {"topics": None})
    assert sum(len(t.partitions) for r in long.results for t in r.topics) == 300
    for count in (5, 300):
        broker.controller.acls = _acls(count)
        out = await _ask(listener, DESCRIBE_ACLS, 3, ANY_FILTER)
        assert sum(len(r.acls) for r in out.resources) == count, out
    assert built_off_the_loop == [False, True, False, True], built_off_the_loop


async def test_long_cluster_wide_listings_are_built_off_the_loop(listener: KafkaListener) -> None:
    # Each of these asks, in a few bytes, for one entry per partition, user or quota of the cluster, and each was
    # built on the event loop: 20,000 entries held it 400 ms (SCRAM users), 355 ms (quotas), 210 ms (reassignments)
    # and 100 ms (elections) (audit). Short ones stay there.
    controller = _broker(listener).controller
    built_off_the_loop = _record_where_answers_are_built(listener)
    asks = [(LIST_PARTITION_REASSIGNMENTS, 0, {"timeout": 1000, "topics": None}, "topics", "partitions"),
            (ELECT_LEADERS, 2, {"election_type": 0, "topic_partitions": None, "timeout": 1000},
             "replica_election_results", "partition_result"),
            (DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": None}, "results", None),
            (DESCRIBE_CLIENT_QUOTAS, 1, {"components": [], "strict": False}, "entries", None)]
    for count in (5, 300):
        controller.listed = count
        for api_key, version, body, field, inner in asks:
            out = await _ask(listener, api_key, version, body)
            assert out.error_code == 0, out
            entries = getattr(out, field)
            assert (sum(len(getattr(e, inner)) for e in entries) if inner else len(entries)) == count, (api_key, out)
    assert built_off_the_loop == [False] * 4 + [True] * 4, built_off_the_loop


async def test_the_configs_of_many_created_topics_are_made_off_the_loop(listener: KafkaListener) -> None:
    # CreateTopics v5+ answers each created topic's configs (about 25 a topic, KIP-525). 1,000 topics with
    # validate_only, which creates nothing and so may be sent again and again, held the loop 190 ms (audit).
    built_off_the_loop = _record_where_answers_are_built(listener)
    for count in (5, 300):
        topics = [{"name": f"c-{count}-{i}", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                   "configs": []} for i in range(count)]
        out = await _ask(listener, CREATE_TOPICS, 7, {"topics": topics, "timeout": 1000, "validate_only": True})
        assert [t.error_code for t in out.topics] == [0] * count, out
        assert all(len(t.configs) > 10 for t in out.topics), out.topics[0]
    assert built_off_the_loop == [False, False, True, True], built_off_the_loop


async def test_find_coordinator_bounds_its_keys_and_looks_each_up_once(listener: KafkaListener) -> None:
    # v4 (KIP-699) keys were bounded by the frame only, and each was looked up on the group pool in turn, copies
    # too: 9,000 keys took 5.7 s (audit). As many as DeleteGroups may name; every copy answered as the first.
    broker = _broker(listener)
    assert await _ask(listener, FIND_COORDINATOR, 4, {"key_type": 0,
                                                      "coordinator_keys": [f"g{i}" for i in range(1001)]}) is None
    assert broker.coordinators_asked == []
    answer = await _ask(listener, FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["a", "b", "a", "a"]})
    assert [(c.key, int(c.error_code), c.node_id, c.port) for c in answer.coordinators] == \
        [("a", 0, NODE_ID, 9092), ("b", 0, NODE_ID, 9092), ("a", 0, NODE_ID, 9092), ("a", 0, NODE_ID, 9092)]
    assert broker.coordinators_asked == ["a", "b"]



def _quota_entry(user: str | None) -> dict[str, Any]:
    return {"entity": [{"entity_type": "user", "entity_name": user}],
            "ops": [{"key": "request_rate", "value": 5.0, "remove": False}]}


async def test_alter_client_quotas_forwards_every_entry_in_one_call(listener: KafkaListener) -> None:
    # One controller call an entry, each waiting for its own commit: 1,000 entries took 30 s (audit). Now one call,
    # which the controller proposes together, and each entry answered as the controller answered it.
    controller = _broker(listener).controller
    entries = [_quota_entry(f"u{i}") for i in range(999)] + [_quota_entry("refused")]
    out = await _ask(listener, ALTER_CLIENT_QUOTAS, 1, {"entries": entries, "validate_only": False})
    assert [int(e.error_code) for e in out.entries] == [0] * 999 + [ErrorCode.INVALID_REQUEST], out.entries[-1]
    assert out.entries[-1].error_message == "more than 10000 quota entities"
    assert controller.quota_calls == [1000]
    # Entries refused by the broker itself, and validate_only, are not forwarded.
    controller.quota_calls.clear()
    out = await _ask(listener, ALTER_CLIENT_QUOTAS, 1, {"entries": [_quota_entry("a"), _quota_entry("a")],
                                                        "validate_only": False})
    assert [int(e.error_code) for e in out.entries] == [ErrorCode.INVALID_REQUEST] * 2
    out = await _ask(listener, ALTER_CLIENT_QUOTAS, 1, {"entries": [_quota_entry("b")], "validate_only": True})
    assert [int(e.error_code) for e in out.entries] == [0] and controller.quota_calls == []


async def test_alter_client_quotas_falls_back_to_one_call_an_entry_on_an_earlier_controller(
        listener: KafkaListener) -> None:
    controller = _broker(listener).controller
    controller.earlier_release = True
    out = await _ask(listener, ALTER_CLIENT_QUOTAS, 1, {"entries": [_quota_entry(f"u{i}") for i in range(3)],
                                                        "validate_only": False})
    assert [int(e.error_code) for e in out.entries] == [0, 0, 0]
    assert controller.quota_calls == [3, 1, 1, 1]  # refused whole (nothing changed), then each entry
