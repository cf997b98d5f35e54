"""Metadata limits are checked by the active controller *before* anything goes to Raft.

One real voter (pysyncobj on loopback) and its QuorumController, ticked by the test: no
broker leases run out behind the test's back, so the Raft commit index moves only when
something is proposed, and "nothing was proposed" is checked exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from quorum_helpers import register_on, single_voter

from metadata_quorum.controller import MAX_TOPICS_PER_REQUEST, ControllerConfig, QuorumController
from metadata_quorum.state import MAX_PARTITIONS_PER_TOPIC
from proto import controller_pb2 as pb
from proto import errors
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

DEFAULTS = {"min.insync.replicas": "2", "max.cluster.partitions": "60"}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuorumController]:
    with single_voter(tmp_path_factory.mktemp("limits"), ControllerConfig(1, "limits", defaults=DEFAULTS)) as ctl:
        register_on(ctl, (1, 2, 3), "limits")
        yield ctl


def create(ctl: QuorumController, *topics: pb.CreatableTopic) -> list[pb.TopicResult]:
    return list(ctl.create_topics(pb.CreateTopicsRequest(topics=list(topics)), 30).results)


def refused_without_proposal(ctl: QuorumController, fn, code: int) -> str:  # type: ignore[no-untyped-def]
    """Run ``fn``; it must refuse with ``code`` (raised or per result) and propose nothing: every
    proposal goes through ``QuorumController._submit``, synchronously, so counting its calls is exact
    (no wait for Raft ticks)."""
    before = ctl.raft.commit_index, ctl.raft.version
    proposed: list[object] = []
    submit = ctl._submit
    ctl._submit = lambda cmd: (proposed.append(cmd), submit(cmd))[1]  # type: ignore[method-assign]
    try:
        results = fn()
    except errors.BrookError as exc:
        assert exc.code == code, exc
        message = exc.message
    else:
        assert [r.error_code for r in results] == [code] * len(results), results
        message = results[0].error_message
    finally:
        del ctl._submit
    assert proposed == [], f"proposed to Raft: {proposed}"
    assert (ctl.raft.commit_index, ctl.raft.version) == before, "something went through Raft"
    return message


def test_a_million_partitions_is_refused_before_raft(controller: QuorumController) -> None:
    took: list[float] = []

    def huge() -> list[pb.TopicResult]:
        started = time.monotonic()
        try:
            return create(controller, pb.CreatableTopic(name="huge", num_partitions=1_000_000,
                                                        replication_factor=1))
        finally:
            took.append(time.monotonic() - started)

    message = refused_without_proposal(controller, huge, ErrorCode.INVALID_PARTITIONS)
    assert str(MAX_PARTITIONS_PER_TOPIC) in message
    print(f"\n1,000,000-partition CreateTopics refused in {took[0] * 1000:.1f} ms")
    refused_without_proposal(controller, lambda: list(controller.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="nope", count=5)]), 30).results), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)


def test_request_and_cluster_partition_limits(controller: QuorumController) -> None:
    too_many = [pb.CreatableTopic(name=f"t{i}", num_partitions=1, replication_factor=1)
                for i in range(MAX_TOPICS_PER_REQUEST + 1)]
    refused_without_proposal(controller, lambda: create(controller, *too_many), ErrorCode.POLICY_VIOLATION)
    # The cluster limit (max.cluster.partitions = 60) counts what exists plus the request.
    assert create(controller, pb.CreatableTopic(name="forty", num_partitions=40, replication_factor=2))[0] \
        .error_code == ErrorCode.NONE
    message = refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="twentyone", num_partitions=21, replication_factor=2)), ErrorCode.POLICY_VIOLATION)
    assert "max.cluster.partitions" in message
    refused_without_proposal(controller, lambda: list(controller.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="forty", count=61)]), 30).results), ErrorCode.POLICY_VIOLATION)


def test_replication_factor_name_and_config_limits(controller: QuorumController) -> None:
    refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="rf4", num_partitions=1, replication_factor=4)), ErrorCode.INVALID_REPLICATION_FACTOR)
    refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="x" * 250, num_partitions=1, replication_factor=1)), ErrorCode.INVALID_TOPIC_EXCEPTION)
    refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="badcfg", num_partitions=1, replication_factor=1, configs={"retention.ms": "soon"})),
        ErrorCode.INVALID_CONFIG)


def test_min_insync_replicas_above_the_replication_factor_is_taken_and_logged(
        controller: QuorumController, caplog: pytest.LogCaptureFixture) -> None:
    """As Kafka takes it: acks=0 and 1 writes go on, acks=all ones are refused with NOT_ENOUGH_REPLICAS
    (tests/kafka_admin). Refusing the create stopped applications that make RF 1 topics of their own on a
    cluster whose default is 2."""
    caplog.set_level("WARNING", logger="metadata_quorum.controller")
    # The topic's own value, at create.
    assert create(controller, pb.CreatableTopic(name="mir", num_partitions=1, replication_factor=2,
                                                configs={"min.insync.replicas": "3"}))[0].error_code == ErrorCode.NONE
    assert "topic 'mir': min.insync.replicas=3 is larger than its replication factor 2" in caplog.text
    # The cluster default (min.insync.replicas = 2) applies to a topic that sets none; explicit assignments too.
    assert create(controller, pb.CreatableTopic(name="mir-1", num_partitions=1, replication_factor=1))[0] \
        .error_code == ErrorCode.NONE
    assert "topic 'mir-1': the cluster default min.insync.replicas=2 is larger than its replication factor 1" \
        in caplog.text
    assert create(controller, pb.CreatableTopic(name="mir-a", assignments=[pb.ReplicaList(replicas=[1])]))[0] \
        .error_code == ErrorCode.NONE

    def alter(**kw: object) -> list[pb.TopicResult]:
        return list(controller.alter_configs(pb.AlterConfigsRequest(
            resources=[pb.AlterConfigsResource(topic="mir-1", **kw)]), 30).results)  # type: ignore[arg-type]

    assert alter(set={"min.insync.replicas": "3"})[0].error_code == ErrorCode.NONE
    entries = controller.describe_configs(pb.DescribeConfigsRequest(topics=["mir-1"])).results[0].entries
    assert {e.name: e.value for e in entries}["min.insync.replicas"] == "3"
    assert alter(delete=["min.insync.replicas"])[0].error_code == ErrorCode.NONE

    caplog.clear()
    controller.alter_cluster_configs(pb.AlterClusterConfigsRequest(set={"min.insync.replicas": "3"}), 30)
    try:
        assert "cluster default min.insync.replicas=3 is larger than the replication factor of" in caplog.text
        assert "mir-1 (RF 1)" in caplog.text and "mir (RF 2)" not in caplog.text  # mir has its own value
    finally:
        controller.alter_cluster_configs(pb.AlterClusterConfigsRequest(delete=["min.insync.replicas"]), 30)


def test_a_request_that_only_validates_logs_nothing_per_topic(controller: QuorumController,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A validate_only CreateTopics or AlterConfigs changes nothing and costs its sender no quota: 20 of them, each
    1,000 topics with min.insync.replicas above their RF, wrote 20,000 WARNING lines (audit). A retried create
    answered as done by an earlier attempt is logged throttled, not once per topic per retry."""
    caplog.set_level("INFO", logger="metadata_quorum.controller")
    topics = [pb.CreatableTopic(name=f"v-{i}", num_partitions=1, replication_factor=1,
                                configs={"min.insync.replicas": "2"}) for i in range(10)]
    results = controller.create_topics(pb.CreateTopicsRequest(topics=topics, validate_only=True), 30).results
    assert [r.error_code for r in results] == [ErrorCode.NONE] * 10, results
    assert create(controller, pb.CreatableTopic(name="v-real", num_partitions=1, replication_factor=1,
                                                configs={"min.insync.replicas": "1"}))[0].error_code == ErrorCode.NONE
    altered = controller.alter_configs(pb.AlterConfigsRequest(validate_only=True, resources=[
        pb.AlterConfigsResource(topic="v-real", set={"min.insync.replicas": "3"})]), 30).results
    assert altered[0].error_code == ErrorCode.NONE
    assert "larger than its replication factor" not in caplog.text, caplog.text
    retried = [pb.CreatableTopic(name=f"r-{i}", num_partitions=1, replication_factor=1, request_id="req-1")
               for i in range(5)]
    assert all(r.error_code == ErrorCode.NONE for r in create(controller, *retried))
    caplog.clear()
    for _ in range(3):
        assert all(r.error_code == ErrorCode.NONE for r in create(controller, *retried))
    assert caplog.text.count("created by an earlier attempt") == 1, caplog.text
    names = ["v-real"] + [t.name for t in retried]  # the cluster's partition limit is small here
    assert all(r.error_code == ErrorCode.NONE
               for r in controller.delete_topics(pb.DeleteTopicsRequest(names=names), 30).results)


def test_config_values_are_short_and_stored_canonical(controller: QuorumController) -> None:
    """"delete," repeated to 4 MB, or a float of 3 million digits, was stored as sent and replicated to every
    node, until the metadata snapshot outgrew what a broker may receive (audit)."""
    message = refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="long-config", num_partitions=1, replication_factor=2,
        configs={"cleanup.policy": "delete," * 1000})), ErrorCode.INVALID_CONFIG)
    assert "longer than 256" in message
    refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="long-float", num_partitions=1, replication_factor=2,
        configs={"min.cleanable.dirty.ratio": "0." + "3" * 3000})), ErrorCode.INVALID_CONFIG)
    [ok] = create(controller, pb.CreatableTopic(name="canonical", num_partitions=1, replication_factor=2,
                                                configs={"cleanup.policy": "delete,compact,delete, compact"}))
    assert ok.error_code == ErrorCode.NONE, ok
    stored = controller.raft.read(lambda s: dict(s.topics["canonical"].configs))
    assert stored == {"cleanup.policy": "delete,compact"}, stored


def test_cluster_topic_defaults_are_short_and_stored_canonical(controller: QuorumController) -> None:
    """A dynamic cluster default is every topic's value unless it has its own: it is held to a topic value's
    bounds. Before, log.cleanup.policy set to 3.5 MB was stored, shown in every topic's DescribeConfigs and
    logged twice at each change (audit)."""
    def alter(values: dict[str, str]) -> list[pb.AlterClusterConfigsResponse]:
        return [controller.alter_cluster_configs(pb.AlterClusterConfigsRequest(set=values), 30)]

    message = refused_without_proposal(controller, lambda: alter({"log.cleanup.policy": "delete," * 1000}),
                                       ErrorCode.INVALID_CONFIG)
    assert "longer than 256" in message, message
    message = refused_without_proposal(controller, lambda: alter({"follower.replication.throttled.rate": "9" * 30}),
                                       ErrorCode.INVALID_CONFIG)
    assert "at most" in message, message
    alter({"log.cleanup.policy": "compact,compact, delete"})
    try:
        stored = controller.raft.read(lambda s: dict(s.cluster_configs))
        assert stored.get("log.cleanup.policy") == "compact,delete", stored
    finally:
        controller.alter_cluster_configs(pb.AlterClusterConfigsRequest(delete=["log.cleanup.policy"]), 30)


@pytest.mark.parametrize("key, value", [("retention.ms", "1_000"), ("retention.ms", "\u0661\u0660\u0660"),
                                        ("min.cleanable.dirty.ratio", "0.5_0"), ("segment.bytes", "1e6")])
def test_numbers_are_written_as_kafkas_tools_read_them(controller: QuorumController, key: str, value: str) -> None:
    """Python's int() and float() read "1_000" and other scripts' digits ("\u0661\u0660\u0660"): such values were
    stored as sent and handed to Kafka clients (DescribeConfigs), whose Java parsers refuse them."""
    refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="odd-number", num_partitions=1, replication_factor=2, configs={key: value})), ErrorCode.INVALID_CONFIG)
    [ok] = create(controller, pb.CreatableTopic(name=f"plain-{value.encode().hex()}", num_partitions=1, replication_factor=2,
                                                configs={key: "+1000" if key != "min.cleanable.dirty.ratio" else ".5"}))
    assert ok.error_code == ErrorCode.NONE, ok


def test_describe_configs_answers_each_topic_once_and_a_bounded_number(controller: QuorumController) -> None:
    """One topic named 350,000 times made the controller build a 794 MB answer (audit)."""
    [ok] = create(controller, pb.CreatableTopic(name="described", num_partitions=1, replication_factor=2))
    assert ok.error_code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS), ok
    answer = controller.describe_configs(pb.DescribeConfigsRequest(topics=["described"] * 5000))
    assert [r.topic for r in answer.results] == ["described"]
    with pytest.raises(errors.BrookError) as refused:
        controller.describe_configs(pb.DescribeConfigsRequest(
            topics=[f"t{i}" for i in range(MAX_TOPICS_PER_REQUEST + 1)]))
    assert refused.value.code == ErrorCode.POLICY_VIOLATION


def test_create_partitions_walks_the_cluster_once_a_request(controller: QuorumController,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each item used to walk every partition of the cluster (brokers' loads) before its count was even
    checked: 1,000 refused items kept a controller of 150,000 partitions busy 51 s (audit)."""
    for name in ("grown", "also-grown"):  # its own topics: it must not depend on another test having run
        [ok] = create(controller, pb.CreatableTopic(name=name, num_partitions=1, replication_factor=2))
        assert ok.error_code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS), ok
    walks: list[int] = []
    real = controller._loads
    monkeypatch.setattr(controller, "_loads", lambda s: (walks.append(1), real(s))[1])
    refused = controller.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="grown", count=1)]), 30)
    assert refused.results[0].error_code == ErrorCode.INVALID_PARTITIONS and walks == [1]
    twice = controller.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="grown", count=2)] * 2, validate_only=True), 30)
    assert [r.error_code for r in twice.results] == [ErrorCode.INVALID_REQUEST] * 2
    walks.clear()
    many = controller.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="grown", count=2, ), pb.CreatePartitionsTopic(name="also-grown", count=2)],
        validate_only=True), 30)
    assert [r.error_code for r in many.results] == [ErrorCode.NONE] * 2, many
    assert walks == [1], walks


def test_elect_leaders_plans_each_partition_once(controller: QuorumController,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic named 5,000 times with no partitions (every one) counted once against the request's bound but
    was expanded 5,000 times under the state lock (audit): each partition is planned once now."""
    [ok] = create(controller, pb.CreatableTopic(name="electable", num_partitions=3, replication_factor=2))
    assert ok.error_code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS), ok
    planned: list[tuple[str, int]] = []
    real = controller._plan_election
    monkeypatch.setattr(controller, "_plan_election",
                        lambda topic, index, *rest: (planned.append((topic, index)), real(topic, index, *rest))[1])
    answer = controller.elect_leaders(pb.ElectLeadersRequest(
        election_type=pb.PREFERRED,
        topic_partitions=[pb.TopicPartitions(topic="electable")] * 5000
        + [pb.TopicPartitions(topic="electable", partitions=[1, 1, 2])] * 3), 30)
    assert sorted(planned) == [("electable", 0), ("electable", 1), ("electable", 2)], planned
    assert sorted((r.topic, r.partition) for r in answer.results) == sorted(set(planned))


def test_index_interval_bytes_above_1_mib_is_refused(controller: QuorumController) -> None:
    """At 2^31-1 a segment's offset index had no entry: every read in the middle of a segment walked it from its
    start, 3.8 s per 100 MiB per fetch entry (audit). A topic's value and the cluster default are refused
    above 1 MiB (storage uses at most that, whatever was stored before)."""
    huge = str(2**31 - 1)
    message = refused_without_proposal(controller, lambda: create(controller, pb.CreatableTopic(
        name="sparse", num_partitions=1, replication_factor=2, configs={"index.interval.bytes": huge})),
        ErrorCode.INVALID_CONFIG)
    assert "index.interval.bytes" in message and "at most 1048576" in message, message
    [ok] = create(controller, pb.CreatableTopic(name="interval", num_partitions=1, replication_factor=2,
                                                configs={"index.interval.bytes": str(1 << 20)}))
    assert ok.error_code == ErrorCode.NONE, ok
    message = refused_without_proposal(controller, lambda: list(controller.alter_configs(pb.AlterConfigsRequest(
        resources=[pb.AlterConfigsResource(topic="interval", set={"index.interval.bytes": huge})]), 30).results),
        ErrorCode.INVALID_CONFIG)
    assert "at most 1048576" in message, message
    message = refused_without_proposal(controller, lambda: controller.alter_cluster_configs(
        pb.AlterClusterConfigsRequest(set={"log.index.interval.bytes": huge}), 30), ErrorCode.INVALID_CONFIG)
    assert "log.index.interval.bytes" in message and "at most 1048576" in message, message
