"""Fetching from the closest replica (KIP-392) with librdkafka: brokers in racks r1, r2, r3 with Kafka's
RackAwareReplicaSelector; a consumer that names a rack (``client.rack``) where the partition's leader is not is
told by the leader to read from the follower in its rack, and reads every record from there, committed ones
only, including records produced while it waits (the follower wakes its long poll when its high watermark
moves). A consumer in the leader's rack, or naming none, reads from the leader. Before, every consumer read from
the leader (reading from followers was listed as not supported)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafkakit import in_sync, partition_leader, unique
from waiting import wait_for

from client.admin import Admin
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

FETCH = 1
RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("follower-fetch"), nodes=3)
    c.state.overrides["replica.selector.class"] = RACK_AWARE
    c.state.node_overrides.update({str(n): {"broker.rack": f"r{n}"} for n in c.broker_ids})
    with c:
        c.wait_ready(60)
        yield c


def _fetches(cluster: LocalCluster, node: int) -> float:
    return cluster.metric(node, "brook_kafka_requests_total", api_key=str(FETCH), listener="KAFKA")


def _produce(cluster: LocalCluster, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({**cluster.kafka_client_config(), "acks": "all", "linger.ms": 5})
    for v in values:
        producer.produce(topic, value=v, partition=0)
    assert producer.flush(30) == 0, "not every record was acknowledged"


def _consume(consumer: Any, count: int, timeout_s: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is None:
            continue
        assert m.error() is None, f"consumer error: {m.error()}"
        got.append(m.value())
    return got


def _consumer(cluster: LocalCluster, topic: str, **conf: Any) -> Any:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**cluster.kafka_client_config(), "group.id": unique("ff-group"), "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", **conf})
    c.assign([TopicPartition(topic, 0, 0)])
    return c


def _replicated_topic(cluster: LocalCluster, prefix: str) -> tuple[str, int]:
    """A new one-partition topic on all 3 brokers, every replica in sync; (its name, its leader)."""
    topic = unique(prefix)
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
        admin.create_topic(topic, 1, 3)
        wait_for(lambda: in_sync(admin, topic, 3), 30, "all 3 replicas in sync")
        return topic, partition_leader(admin, topic)


def test_a_consumer_reads_from_the_follower_in_its_rack(cluster: LocalCluster) -> None:
    topic, leader = _replicated_topic(cluster, "ff")
    follower = next(n for n in cluster.broker_ids if n != leader)
    first = [b"a-%d" % i for i in range(500)]
    _produce(cluster, topic, first)

    before = {n: _fetches(cluster, n) for n in cluster.broker_ids}
    # A long fetch.wait.max.ms: records produced while the consumer waits reach it within the test's bound only
    # if the follower's long poll wakes when its high watermark moves.
    consumer = _consumer(cluster, topic, **{"client.rack": f"r{follower}", "fetch.wait.max.ms": 20_000})
    try:
        assert _consume(consumer, len(first), 30) == first
        waited = _consume(consumer, 1, 2)  # parked at the tail, on the follower
        assert waited == []
        later = [b"b-%d" % i for i in range(50)]
        started = time.monotonic()
        _produce(cluster, topic, later)
        assert _consume(consumer, len(later), 10) == later
        took = time.monotonic() - started
    finally:
        consumer.close()
    after = {n: _fetches(cluster, n) for n in cluster.broker_ids}
    served = {n: after[n] - before[n] for n in cluster.broker_ids}
    # The leader answers the first fetch (naming the follower); every other fetch goes to the follower.
    assert served[follower] >= 2 and served[follower] > served[leader], served
    assert took < 10, f"records produced during the long poll took {took:.1f} s"


def test_a_consumer_in_the_leaders_rack_or_naming_none_reads_from_the_leader(cluster: LocalCluster) -> None:
    topic, leader = _replicated_topic(cluster, "ff-leader")
    values = [b"v-%d" % i for i in range(200)]
    _produce(cluster, topic, values)
    followers = [n for n in cluster.broker_ids if n != leader]
    for conf in ({"client.rack": f"r{leader}"}, {}):
        before = {n: _fetches(cluster, n) for n in followers}
        consumer = _consumer(cluster, topic, **conf)
        try:
            assert _consume(consumer, len(values), 30) == values
        finally:
            consumer.close()
        assert {n: _fetches(cluster, n) - before[n] for n in followers} == {n: 0 for n in followers}, conf


def test_a_consumer_reading_from_a_killed_follower_goes_back_to_the_leader(cluster: LocalCluster) -> None:
    """Liveness: the follower a consumer reads from is killed (kill -9) while records keep coming; the consumer
    reads every record, in order, within a bound (librdkafka gives up on the refused connection and asks the
    leader, which names the follower only while it is in the ISR). Measured: about 7 s without records."""
    topic, leader = _replicated_topic(cluster, "ff-kill")
    follower = next(n for n in cluster.broker_ids if n != leader)
    first = [b"k-%d" % i for i in range(300)]
    _produce(cluster, topic, first)
    consumer = _consumer(cluster, topic, **{"client.rack": f"r{follower}"})
    try:
        assert _consume(consumer, len(first), 30) == first
        cluster.kill_node(follower)
        killed = time.monotonic()
        later = [b"l-%d" % i for i in range(300)]
        _produce(cluster, topic, later)
        assert _consume(consumer, len(later), 45) == later
        took = time.monotonic() - killed
    finally:
        consumer.close()
        cluster.start_node(follower)
        cluster.wait_ready(60)
    assert took < 45, took
