"""kafka-python's KafkaAdminClient (Kafka's newest message versions) against the KAFKA listener of a real
TLS + authorizer cluster, as User:admin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from waiting import wait_for

pytestmark = pytest.mark.slow

T = 30


def _partitions(admin: Any, name: str) -> int:
    found = [t for t in admin.describe_topics([name]) if t["name"] == name and t["error_code"] == 0]
    return len(found[0]["partitions"]) if found else 0


def _partition0(admin: Any, name: str) -> dict[str, Any]:
    topic = [t for t in admin.describe_topics([name]) if t["name"] == name][0]
    return [p for p in topic["partitions"] if p["partition_index"] == 0][0]


def test_topics_configs_and_partitions(kcluster: Any, kp_admin: Any, topic_name: str) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    a = kp_admin
    brokers = sorted(kcluster.broker_ids)
    a.create_topics({topic_name: {"assignments": {0: [brokers[0], brokers[1]], 1: [brokers[1], brokers[2]]},
                                  "configs": {"retention.ms": "7200000"}}}, timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 2, T, "the topic")
    defaults = "ka-d-" + topic_name[3:]
    a.create_topics({defaults: {}}, timeout_ms=T * 1000)  # -1/-1: the cluster's num.partitions / replication
    wait_for(lambda: _partitions(a, defaults) >= 1, T, "the topic with default counts")

    described = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])
    assert described["topic"][topic_name]["retention.ms"]["value"] == "7200000"  # 'modified' filter: overrides

    a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name, {"retention.ms": "60000"})])
    described = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])
    assert described["topic"][topic_name]["retention.ms"]["value"] == "60000"

    broker = str(brokers[0])
    mine = a.describe_configs([ConfigResource(ConfigResourceType.BROKER, broker)], config_filter="all")
    assert mine["broker"][broker]["node.id"]["value"] == broker
    assert mine["broker"][broker]["num.partitions"]["config_source"] == "STATIC_BROKER_CONFIG"
    for key in ("inter.broker.sasl.password", "scram.bootstrap.users"):  # set on this cluster: never shown
        secret = mine["broker"][broker].get(key)
        assert secret is None or (secret["value"] is None and secret["is_sensitive"]), secret

    a.create_partitions({topic_name: 3}, timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 3, T, "3 partitions")

    dirs = a.describe_log_dirs({topic_name: [0]}, brokers=[brokers[0]])
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
            for d in dirs[0]["log_dirs"] for t in d["topics"]] == [(topic_name, [0])]

    a.delete_topics([topic_name, defaults], timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 0 and _partitions(a, defaults) == 0, T, "the topics gone")


def test_reassignment_and_election(kcluster: Any, kp_admin: Any, topic_name: str) -> None:
    from kafka import TopicPartition
    from kafka.protocol.admin import ElectionType

    a = kp_admin
    brokers = sorted(kcluster.broker_ids)
    a.create_topics({topic_name: {"assignments": {0: [brokers[0], brokers[1]]}}}, timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 1, T, "the topic")
    wait_for(lambda: _partition0(a, topic_name)["leader_id"] == brokers[0], T, "the first replica to lead")
    tp = TopicPartition(topic_name, 0)
    a.alter_partition_reassignments({tp: [brokers[2], brokers[1]]}, timeout_ms=T * 1000)

    def moved(replicas: list[int]) -> Callable[[], bool]:
        def done() -> bool:
            return not a.list_partition_reassignments([tp]) and _partition0(a, topic_name)["replica_nodes"] == replicas
        return done

    wait_for(moved([brokers[2], brokers[1]]), 60, "the move to finish")
    leader = _partition0(a, topic_name)["leader_id"]
    assert leader in (brokers[2], brokers[1])
    # Put the other replica first: the leader stays, so only an election makes the new first one lead.
    other = brokers[1] if leader == brokers[2] else brokers[2]
    a.alter_partition_reassignments({tp: [other, leader]}, timeout_ms=T * 1000)
    wait_for(moved([other, leader]), 60, "the reorder to finish")
    assert _partition0(a, topic_name)["leader_id"] == leader, "a reorder alone moved the leader"
    # kafka-python reads a list as topic names: the partitions go as {topic: [partition ids]}.
    resp = a.elect_leaders(ElectionType.PREFERRED, {topic_name: [0]}, timeout_ms=T * 1000)
    results = [(r.topic, p.partition_id, p.error_code) for r in resp.replica_election_results
               for p in r.partition_result]
    assert results == [(topic_name, 0, 0)], results
    wait_for(lambda: _partition0(a, topic_name)["leader_id"] == other, T, "the elected preferred replica to lead")
    a.delete_topics([topic_name], timeout_ms=T * 1000)
